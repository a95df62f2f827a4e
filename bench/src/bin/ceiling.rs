//! The transport ceiling: the webhook's stack (hyper-util's auto builder over tokio-rustls with
//! the webhook's own TLS configuration) answering a fixed AdmissionReview without reading the
//! request: it reads every request body to the end, finds the request's uid (the first
//! `"uid":"` in the body, where the API server and the load generator write it) and echoes it
//! in the fixed answer, as every webhook must. No webhook on this machine can do more requests
//! per second than this.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use sidecar_injector::config::Injector;
use sidecar_injector::review::{self, Webhook};
use sidecar_injector::server::{self, tls};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (loopback).
    #[arg(long)]
    listen: SocketAddr,
    /// Serving certificate (PEM). Without it, the webhook's development certificate is made.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Where the development certificate's CA is written when no certificate is given.
    #[arg(long)]
    dev_ca_file: Option<PathBuf>,
    /// The server exits by itself after this many seconds, even if nobody stops it.
    #[arg(long, default_value_t = 900)]
    exit_after: u64,
    /// Also run the webhook's engine on every request body (its answer is dropped; the fixed
    /// answer is sent): the transport plus the engine, without the webhook's shell (routing,
    /// limits, timeouts, metrics, logs, drain). For telling the engine's share of a gap from
    /// the shell's.
    #[arg(long)]
    engine: bool,
    /// With --engine, review each body this many times in a row: the runs after the first find
    /// the engine's code and data in the caches the first brought them to, so the difference
    /// between two and one is what a review costs warm inside the server, and one less the
    /// plain ceiling what it costs as it comes.
    #[arg(long, default_value_t = 1, requires = "engine")]
    engine_runs: u32,
    /// Spin this many microseconds on every request (on top of --engine, if given): an engine
    /// of known cost that fetches nothing, for finding how the p99 goal's ratio grows with
    /// what a review costs the server (`bench/p99-noise.py sb`).
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    anyhow::ensure!(args.listen.ip().is_loopback(), "listen on loopback only");
    // The answer the webhook gives for the bench's review: same bytes, same size.
    let injector = Arc::new(Injector::embedded(None)?);
    let answer = review::answer(
        &injector,
        Webhook::Mutate,
        &sidecar_injector_bench::review_body()?,
    )?;
    let answer = Echo::new(
        answer.body,
        &sidecar_injector_bench::request_uid(&sidecar_injector_bench::review_body()?)?,
    )?;

    let loaded = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => tls::CertFiles {
            cert: cert.clone(),
            key: key.clone(),
        }
        .load()?,
        _ => {
            let dev = tls::dev_cert()?;
            if let Some(path) = &args.dev_ca_file {
                std::fs::write(path, &dev.ca_pem).with_context(|| path.display().to_string())?;
            }
            dev.loaded
        }
    };
    let resolver = Arc::new(tls::Resolver::new(loaded.key));
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(resolver)?));

    // The webhook's runtime shape (`sidecar-injector serve`): the listener on a runtime of one
    // worker, each connection on one of the serving threads (`server::cores`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let cores = server::cores::Cores::start(server::cores::count(0))?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(args.listen).await?;
        tokio::select! {
            () = serve(listener, &cores, acceptor, answer, args.engine.then_some((injector, args.engine_runs)), Duration::from_micros(args.spin_us)) => {}
            () = tokio::time::sleep(Duration::from_secs(args.exit_after)) => {}
            // SIGINT ends it cleanly too (a profiler writes its counts at a clean exit).
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

async fn serve(
    listener: TcpListener,
    cores: &server::cores::Cores,
    acceptor: TlsAcceptor,
    answer: Echo,
    engine: Option<(Arc<Injector>, u32)>,
    spin: Duration,
) {
    // The webhook's own connection settings, with its default header-read timeout.
    let builder = Arc::new(server::http_builder(Duration::from_secs(5)));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, builder, answer) = (acceptor.clone(), builder.clone(), answer.clone());
        let engine = engine.clone();
        cores.serve(tcp, move |tcp| async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await
            else {
                return;
            };
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (answer, engine) = (answer.clone(), engine.clone());
                    async move {
                        // Read the whole body, as any webhook must, and ignore it (or review it
                        // and drop the review, with --engine).
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let answer = answer.to(body.as_deref().unwrap_or_default());
                        if let (Some((injector, runs)), Ok(body)) = (&engine, body) {
                            for _ in 0..*runs {
                                let review = review::answer(injector, Webhook::Mutate, &body);
                                std::hint::black_box(review.ok());
                            }
                        }
                        if !spin.is_zero() {
                            let started = std::time::Instant::now();
                            while started.elapsed() < spin {
                                std::hint::spin_loop();
                            }
                        }
                        let mut response = Response::new(Full::new(answer));
                        response.headers_mut().insert(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, Infallible>(response)
                    }
                });
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

/// The fixed answer, split around its uid.
#[derive(Clone)]
struct Echo {
    before: Bytes,
    after: Bytes,
}

impl Echo {
    fn new(answer: Vec<u8>, uid: &str) -> anyhow::Result<Self> {
        let key = format!("\"uid\":\"{uid}\"");
        let at = memchr::memmem::find(&answer, key.as_bytes())
            .context("the fixed answer does not echo its uid")?
            + key.len()
            - 1
            - uid.len();
        let answer = Bytes::from(answer);
        Ok(Self {
            before: answer.slice(..at),
            after: answer.slice(at + uid.len()..),
        })
    }

    /// The answer to `body`, with its uid (none if the body has no `"uid":"`).
    fn to(&self, body: &[u8]) -> Bytes {
        const KEY: &[u8] = b"\"uid\":\"";
        let uid = memchr::memmem::find(body, KEY)
            .map(|at| &body[at + KEY.len()..])
            .and_then(|rest| memchr::memchr(b'"', rest).map(|end| &rest[..end]))
            .unwrap_or_default();
        let mut out = Vec::with_capacity(self.before.len() + uid.len() + self.after.len());
        out.extend_from_slice(&self.before);
        out.extend_from_slice(uid);
        out.extend_from_slice(&self.after);
        Bytes::from(out)
    }
}
