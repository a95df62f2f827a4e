//! The webhook server: TLS for the API server, a plain admin port, reloads, limits, shutdown.
//!
//! A shell around the engine. It owns the sockets, the certificates, the tokio runtime,
//! signals, logging and metrics; every answer to a review comes from
//! [`crate::engine::review`], and the configuration is read through [`crate::load`]. It may
//! not import [`crate::cli`]: the `serve` command imports the server, not the other way round.

pub mod certs;
pub mod cores;
pub mod drain;
pub mod metrics;
pub mod policies;
pub mod reload;
pub mod routes;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::load::ConfigArg;
use routes::State;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Flags of `serve`; each is also read from an environment variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the TLS listener for the API server (POST /mutate, POST /validate).
    #[arg(long, env = "SIDECAR_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP admin listener (GET /livez, /readyz, /metrics).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_ADMIN_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub admin_listen: SocketAddr,
    /// Serving certificate chain (PEM). Without it, a self-signed development certificate is made.
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// Where the development certificate's CA is written when no certificate is given.
    #[arg(long, env = "SIDECAR_INJECTOR_DEV_CA_FILE", value_name = "PATH")]
    pub dev_ca_file: Option<PathBuf>,
    /// Log format. Default: json when standard error is not a terminal, else text.
    #[arg(long, env = "SIDECAR_INJECTOR_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Largest accepted request body, in bytes (the API server's own request limit is 3 MiB).
    #[arg(long, env = "SIDECAR_INJECTOR_MAX_BODY_BYTES", default_value_t = 6 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Time allowed for a client to complete its TLS handshake, and then to send its request
    /// headers; a connection that has sent no request this long after its handshake is closed.
    #[arg(long, env = "SIDECAR_INJECTOR_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub header_read_timeout: Duration,
    /// Time allowed for one request, body included (the API server gives up after 30s at most).
    #[arg(long, env = "SIDECAR_INJECTOR_REQUEST_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub request_timeout: Duration,
    /// On SIGTERM, how long to go on accepting and answering with /readyz failing, before
    /// the listener closes. In a cluster the API server may still dial this pod for a moment
    /// after it is deleted (until the endpoint removal reaches it); set this longer than that
    /// (the chart sets 5s).
    #[arg(long, env = "SIDECAR_INJECTOR_SHUTDOWN_DELAY", value_parser = parse_duration, default_value = "0s")]
    pub shutdown_delay: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish once the listener is closed.
    #[arg(long, env = "SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT", value_parser = parse_duration, default_value = "20s")]
    pub shutdown_timeout: Duration,
    /// How many recent answers to keep, by request body: a pod that arrives like one just
    /// answered but for its uid and its service account token volume's random name (the
    /// replicas of a workload, created in the same second) is answered from memory without
    /// being read again. At most 8 MiB; 0 turns it off.
    #[arg(long, env = "SIDECAR_INJECTOR_MEMO_ENTRIES", default_value_t = crate::engine::memo::DEFAULT_ENTRIES)]
    pub memo_entries: usize,
    /// How often files are re-checked in case a change notification was missed.
    #[arg(long, env = "SIDECAR_INJECTOR_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub reload_interval: Duration,
    /// Threads that serve the API server's connections, each connection on one of them from
    /// start to end. 0: one per CPU the process may use (the CPU limit counts), or
    /// TOKIO_WORKER_THREADS when set.
    #[arg(long, env = "SIDECAR_INJECTOR_SERVING_THREADS", default_value_t = 0)]
    pub serving_threads: usize,
    #[command(flatten)]
    pub backstop: BackstopArgs,
    #[command(flatten)]
    pub certificates: CertificateArgs,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// Flags of self-managed certificates (`serve --certificates-secret`).
#[derive(Debug, Args)]
pub struct CertificateArgs {
    /// Look after the serving certificate: a CA and a serving certificate kept in this
    /// kubernetes.io/tls Secret of the server's namespace (ca.crt, ca.key, tls.crt, tls.key),
    /// issued when missing or unusable, renewed with a third of its life left, the CA rolled
    /// over with overlap; and the caBundle of the configurations --ca-bundle-of names kept
    /// equal to the Secret's CAs (server-side apply of that field only, re-checked every
    /// --reload-interval). Every replica serves what the Secret holds. Replaces
    /// --tls-cert-file; needs rights on that Secret and those configurations (the chart's
    /// default `selfManaged` mode grants them, by name).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CERTIFICATES_SECRET",
        value_name = "NAME",
        conflicts_with_all = ["tls_cert_file", "policies_only"],
        requires_all = ["certificate_names", "ca_bundle_of"]
    )]
    pub certificates_secret: Option<String>,
    /// The names the serving certificate is valid for, comma-separated: the Service's DNS
    /// names the API server dials (an IP address is written as one).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CERTIFICATE_NAMES",
        value_name = "NAME,...",
        value_delimiter = ','
    )]
    pub certificate_names: Vec<String>,
    /// The webhook configurations whose caBundle is kept, comma-separated: mutating/NAME,
    /// validating/NAME. The Secret is owned by the mutating one (deleting it deletes the
    /// Secret).
    #[arg(
        long,
        env = "SIDECAR_INJECTOR_CA_BUNDLE_OF",
        value_name = "KIND/NAME,...",
        value_delimiter = ','
    )]
    pub ca_bundle_of: Vec<certs::WebhookConfig>,
    /// Lifetime of each CA the server issues.
    #[arg(long, env = "SIDECAR_INJECTOR_CA_LIFETIME", value_parser = parse_duration, default_value = "365d")]
    pub ca_lifetime: Duration,
    /// Lifetime of each serving certificate (never past its CA's end).
    #[arg(long, env = "SIDECAR_INJECTOR_SERVING_CERTIFICATE_LIFETIME", value_parser = parse_duration, default_value = "60d")]
    pub serving_certificate_lifetime: Duration,
    /// How long an old CA stays trusted after the serving certificate is switched to its
    /// successor: long enough for every replica to look at the Secret again (at least twice
    /// --reload-interval).
    #[arg(long, env = "SIDECAR_INJECTOR_CERTIFICATE_RELOAD_GRACE", value_parser = parse_duration, default_value = "5m")]
    pub certificate_reload_grace: Duration,
}

impl CertificateArgs {
    /// What to look after, or `None` without --certificates-secret. Refuses lifetimes the
    /// rotation cannot keep without a gap.
    fn managed(&self, interval: Duration) -> anyhow::Result<Option<certs::Managed>> {
        let Some(secret) = &self.certificates_secret else {
            return Ok(None);
        };
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let policy = crate::certs::plan::Policy {
            ca_lifetime: secs(self.ca_lifetime),
            serving_lifetime: secs(self.serving_certificate_lifetime),
            reload_grace: secs(self.certificate_reload_grace),
            recheck: secs(interval).max(1),
            ..crate::certs::plan::Policy::default()
        };
        if policy.reload_grace < 2 * policy.recheck {
            anyhow::bail!(
                "--certificate-reload-grace ({}s) must be at least twice --reload-interval ({}s): every replica looks at the Secret once an interval",
                policy.reload_grace,
                policy.recheck
            );
        }
        for (flag, lifetime) in [
            ("--ca-lifetime", policy.ca_lifetime),
            ("--serving-certificate-lifetime", policy.serving_lifetime),
        ] {
            if lifetime < 3 * policy.reload_grace {
                anyhow::bail!(
                    "{flag} ({lifetime}s) must be at least three times --certificate-reload-grace ({}s): a certificate is renewed with a third of its life left, and an old CA must outlast the grace",
                    policy.reload_grace
                );
            }
        }
        Ok(Some(certs::Managed {
            secret: secret.clone(),
            namespace: crate::load::own_namespace(),
            names: self.certificate_names.clone(),
            webhooks: self.ca_bundle_of.clone(),
            policy,
        }))
    }
}

/// Flags of `serve --backstop` and `serve --mutating-policy`.
#[derive(Debug, Args)]
pub struct BackstopArgs {
    /// Keep the backstop (the ValidatingAdmissionPolicy and bindings `export backstop` writes)
    /// in step with the configuration served: applied (server-side apply) at start, after
    /// every reload, whenever a re-check (--reload-interval) finds it missing or exported from
    /// another configuration, and every 5 minutes anyway (undoing a hand edit). Needs rights on
    /// those objects (the chart grants them, by name); a failure is retried, logged and shown
    /// by sidecar_injector_backstop_in_step == 0.
    #[arg(long = "backstop", env = "SIDECAR_INJECTOR_BACKSTOP")]
    pub enabled: bool,
    /// Keep the MutatingAdmissionPolicy (`export mutating`) in step the same way: policy mode,
    /// where the API server injects. auto: v1 where the API server serves it, else v1beta1.
    #[arg(
        long = "mutating-policy",
        env = "SIDECAR_INJECTOR_MUTATING_POLICY",
        value_enum,
        value_name = "VERSION"
    )]
    pub mutating: Option<policies::MutatingApi>,
    /// The cluster-scoped object that owns the kept policies, so that deleting it (`helm
    /// uninstall`) deletes them too (the garbage collector): NAME (a
    /// MutatingWebhookConfiguration) or ClusterRole/NAME.
    #[arg(
        long = "backstop-owner",
        env = "SIDECAR_INJECTOR_BACKSTOP_OWNER",
        value_name = "NAME|ClusterRole/NAME"
    )]
    pub owner: Option<policies::Owner>,
    /// Also refuse a sidecar whose image is not the one its template sets (in a pod injected
    /// under the configuration served, or not injected at all).
    #[arg(long = "backstop-check-images", env = "SIDECAR_INJECTOR_BACKSTOP_CHECK_IMAGES", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub check_images: bool,
    /// Serve no webhooks: no TLS listener and no certificate, only the admin port, reloads and
    /// the policies kept in step (--backstop, --mutating-policy). The chart's policy mode runs
    /// this: the API server injects, and this process only keeps its policies current.
    #[arg(long = "policies-only", env = "SIDECAR_INJECTOR_POLICIES_ONLY")]
    pub policies_only: bool,
    #[command(flatten)]
    pub selection: crate::load::SelectionArgs,
}

/// Parses `250ms`, `5s`, `2m`, `3h`, `30d` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (examples: 250ms, 5s, 2m, 30d)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m, h or d)"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn init_logging(format: Option<LogFormat>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = match format {
        Some(f) => f == LogFormat::Json,
        None => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) keeps the first subscriber.
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

impl ServeArgs {
    /// Runs the server until SIGTERM or SIGINT, then drains and returns.
    pub fn run(self) -> anyhow::Result<()> {
        init_logging(self.log_format);
        // The listeners, the admin port and reloads; connections are served on threads of
        // their own (`cores`).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let server = Server::start(self).await?;
            server.run_until(shutdown_signal()).await
        })
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// A started server: configuration and certificate loaded, both ports bound.
pub struct Server {
    pub state: Arc<State>,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The webhooks' listener; none with `--policies-only`.
    tls: Option<(TcpListener, TlsAcceptor)>,
    admin_listener: TcpListener,
    header_read_timeout: Duration,
    shutdown_delay: Duration,
    shutdown_timeout: Duration,
    serving_threads: usize,
    reloader: tokio::task::JoinHandle<()>,
    backstop: Option<tokio::task::JoinHandle<()>>,
    /// The keeper of self-managed certificates (`--certificates-secret`).
    keeper: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Loads everything and binds the ports. Fails, with the reason, if anything is missing:
    /// a server that cannot inject must not look ready.
    pub async fn start(args: ServeArgs) -> anyhow::Result<Self> {
        let ServeArgs {
            listen,
            admin_listen,
            tls_cert_file,
            tls_key_file,
            dev_ca_file,
            log_format: _,
            max_body_bytes,
            header_read_timeout,
            request_timeout,
            shutdown_delay,
            shutdown_timeout,
            memo_entries,
            reload_interval,
            serving_threads,
            backstop,
            certificates,
            config,
        } = args;
        let managed = certificates.managed(reload_interval)?;
        let (sources, injector) = match &config.path {
            Some(path) => {
                let sources = crate::load::Sources::read(path)?;
                let fingerprint = sources.fingerprint();
                let dirs = sources.dirs.clone();
                (
                    Some((path.clone(), reload::Tracked::new(fingerprint), dirs)),
                    sources.build(crate::load::own_namespace())?,
                )
            }
            None => (
                None,
                crate::engine::config::Injector::embedded(crate::load::own_namespace())?,
            ),
        };
        for advice in &injector.advisories {
            tracing::warn!(%advice, "configuration loaded with a warning");
        }
        let state = Arc::new(State::new(
            injector,
            max_body_bytes,
            request_timeout,
            memo_entries,
        ));
        let policies_only = backstop.policies_only;
        if policies_only && !backstop.enabled && backstop.mutating.is_none() {
            anyhow::bail!(
                "--policies-only serves no webhooks: it needs a policy to keep (--backstop, --mutating-policy)"
            );
        }
        let admin_listener = TcpListener::bind(admin_listen)
            .await
            .with_context(|| format!("cannot listen on {admin_listen}"))?;
        let admin_listen = admin_listener.local_addr()?;
        let (tls, cert_files, keeper) = if policies_only {
            (None, None, None)
        } else {
            let source = match (managed, tls_cert_file, tls_key_file) {
                (Some(managed), _, _) => Source::Managed(managed, reload_interval),
                (None, Some(cert), Some(key)) => Source::Files(tls::CertFiles { cert, key }),
                (None, _, _) => Source::Development(dev_ca_file),
            };
            let (tls, listen, cert_files, keeper) =
                webhook_listener(listen, source, &state).await?;
            (Some((tls, listen)), cert_files, keeper)
        };
        let listen = tls.as_ref().map_or(listen, |(_, addr)| *addr);
        let tls = tls.map(|(tls, _)| tls);
        let reloader = tokio::spawn(reload::run(reload::Reloader {
            state: state.clone(),
            cert_files,
            config: sources,
            interval: reload_interval,
        }));
        let keep = backstop.enabled || backstop.mutating.is_some();
        let backstop = keep.then(|| {
            tokio::spawn(policies::run(
                state.clone(),
                policies::Policies {
                    selection: backstop.selection.selection(),
                    backstop: backstop.enabled,
                    mutating: backstop.mutating,
                    owner: backstop.owner,
                    check_images: backstop.check_images,
                    interval: reload_interval,
                },
            ))
        });
        let serving_threads = cores::count(serving_threads);
        let config_path = config
            .path
            .as_ref()
            .map_or("<embedded>".into(), |p| p.display().to_string());
        if policies_only {
            tracing::info!(%admin_listen, config = %config_path, "keeping the policies in step; serving no webhooks (--policies-only)");
        } else {
            tracing::info!(%listen, %admin_listen, serving_threads, config = %config_path, "serving");
        }
        Ok(Self {
            state,
            listen,
            admin_listen,
            tls,
            admin_listener,
            header_read_timeout,
            shutdown_delay,
            shutdown_timeout,
            serving_threads,
            reloader,
            backstop,
            keeper,
        })
    }

    /// Serves until `shutdown` resolves; then readiness fails, new requests are still accepted
    /// and answered for `--shutdown-delay`, the listener closes, in-flight requests finish (at
    /// most `--shutdown-timeout`), and this returns.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Self {
            state,
            tls,
            admin_listener,
            header_read_timeout,
            shutdown_delay,
            shutdown_timeout,
            serving_threads,
            reloader,
            backstop,
            keeper,
            ..
        } = self;
        let builder = Arc::new(http_builder(header_read_timeout));
        let admin = tokio::spawn(serve_admin(admin_listener, state.clone(), builder.clone()));
        match tls {
            Some((tls_listener, acceptor)) => {
                let cores = cores::Cores::start(serving_threads)
                    .context("cannot start the serving threads")?;
                let drain = drain::Drain::new();
                {
                    let accept = accept_tls(
                        &tls_listener,
                        &cores,
                        &acceptor,
                        &state,
                        &builder,
                        &drain,
                        header_read_timeout,
                    );
                    tokio::pin!(accept);
                    tokio::select! {
                        () = &mut accept => {}
                        () = shutdown => {}
                    }
                    state.draining.store(true, Ordering::SeqCst);
                    if !shutdown_delay.is_zero() {
                        // Whoever still routes here (an endpoint list not yet updated) is still answered.
                        tracing::info!(delay = ?shutdown_delay, "not ready; still accepting until the delay ends");
                        tokio::select! {
                            () = &mut accept => {}
                            () = tokio::time::sleep(shutdown_delay) => {}
                        }
                    }
                }
                drop(tls_listener);
                tracing::info!("listener closed; draining in-flight requests");
                match tokio::time::timeout(shutdown_timeout, drain.finish()).await {
                    Ok(()) => tracing::info!("drained; exiting"),
                    Err(_) => {
                        tracing::warn!(timeout = ?shutdown_timeout, "drain timed out; exiting with requests in flight")
                    }
                }
            }
            None => {
                // Nothing is served but the admin port: nothing to drain.
                shutdown.await;
                state.draining.store(true, Ordering::SeqCst);
                tracing::info!("exiting");
            }
        }
        reloader.abort();
        for task in backstop.into_iter().chain(keeper) {
            task.abort();
        }
        admin.abort();
        Ok(())
    }
}

/// Where the serving certificate comes from.
enum Source {
    /// `--tls-cert-file` and `--tls-key-file`, reloaded when they change.
    Files(tls::CertFiles),
    /// `--certificates-secret`: looked after by the server, re-checked every interval.
    Managed(certs::Managed, Duration),
    /// Neither: a development certificate whose CA is written to the file given (or a
    /// temporary one).
    Development(Option<PathBuf>),
}

/// The reloader's view of certificate files.
type Watched = Option<(tls::CertFiles, reload::Tracked, Arc<tls::Resolver>)>;

/// The webhooks' TLS listener, bound, with its certificate from `source`. Also the
/// certificate files the reloader watches, and the task that looks after self-managed
/// certificates.
async fn webhook_listener(
    listen: SocketAddr,
    source: Source,
    state: &Arc<State>,
) -> anyhow::Result<(
    (TcpListener, TlsAcceptor),
    SocketAddr,
    Watched,
    Option<tokio::task::JoinHandle<()>>,
)> {
    let (loaded, files, started) = match source {
        Source::Files(files) => (files.load()?, Some(files), None),
        Source::Managed(managed, interval) => {
            let started = certs::start(managed, state).await?;
            let loaded = started.loaded.clone();
            (loaded, None, Some((started, interval)))
        }
        Source::Development(dev_ca_file) => {
            let dev = tls::dev_cert()?;
            let path = dev_ca_file
                .unwrap_or_else(|| std::env::temp_dir().join("sidecar-injector-dev-ca.pem"));
            std::fs::write(&path, &dev.ca_pem).with_context(|| {
                format!("cannot write the development CA to {}", path.display())
            })?;
            tracing::warn!(
                ca_file = %path.display(),
                "no --tls-cert-file given: serving a self-signed development certificate for localhost, 127.0.0.1 and ::1; \
                 its CA is written to ca_file (curl --cacert <ca_file> https://localhost:8443/...). Do not use it in a cluster"
            );
            (dev.loaded, None, None)
        }
    };
    state.metrics.certificate_expiry(loaded.not_after);
    let resolver = Arc::new(tls::Resolver::new(loaded.key.clone()));
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(resolver.clone())?));
    let tls_listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let listen = tls_listener.local_addr()?;
    let keeper = started.map(|(started, interval)| {
        tokio::spawn(certs::run(
            started,
            resolver.clone(),
            state.clone(),
            interval,
        ))
    });
    let files = files.map(|f| (f, reload::Tracked::new(loaded.fingerprint), resolver));
    Ok(((tls_listener, acceptor), listen, files, keeper))
}

/// The HTTP/1.1 + HTTP/2 connection settings of both listeners: `header_read_timeout`
/// for HTTP/1.1 requests, keep-alive, and HTTP/2 pings every 20 s. Public so the load
/// benchmark's transport ceiling (bench/src/bin/ceiling.rs) serves with the same settings.
pub fn http_builder(header_read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)));
    builder
}

async fn accept_tls(
    listener: &TcpListener,
    cores: &cores::Cores,
    acceptor: &TlsAcceptor,
    state: &Arc<State>,
    builder: &Arc<auto::Builder<TokioExecutor>>,
    drain: &drain::Drain,
    header_read_timeout: Duration,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, state, builder) = (acceptor.clone(), state.clone(), builder.clone());
        let watch = drain.watch();
        cores.serve(tcp, move |tcp| async move {
            let tls = match tokio::time::timeout(header_read_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let activity = watch.activity();
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (state, activity) = (state.clone(), activity.clone());
                    let version = req.version();
                    let request = activity.start(version);
                    async move {
                        let mut response = routes::webhook(state, req).await;
                        activity.draining_response(version, &mut response);
                        drop(request);
                        Ok::<_, Infallible>(response)
                    }
                });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Some(Err(error)) = watch.serve(conn, header_read_timeout).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
}

async fn serve_admin(
    listener: TcpListener,
    state: Arc<State>,
    builder: Arc<auto::Builder<TokioExecutor>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (state, builder) = (state.clone(), builder.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = routes::admin(&state, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}
