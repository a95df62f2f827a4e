//! Shared helpers for the server tests: certificates, a TLS client, review bodies, the real
//! binary as a child process, and keep-alive clients for load under a drain.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser as _;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sidecar_injector::cli::{Cli, Command};
use sidecar_injector::server::ServeArgs;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A CA and a serving certificate for 127.0.0.1 / localhost, PEM.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn pki(name: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: key.serialize_pem(),
    }
}

impl Pki {
    pub fn write(&self, dir: &Path) {
        std::fs::write(dir.join("tls.crt"), &self.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &self.key_pem).unwrap();
    }
}

/// A free port on 127.0.0.1 (bound and released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `serve` arguments as a user would type them.
pub fn serve_args(extra: &[&str]) -> ServeArgs {
    let mut argv = vec![
        "sidecar-injector",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Serve(args) => *args,
        other => panic!("not serve: {other:?}"),
    }
}

pub async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    install_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// One POST over HTTP/1.1 on a new connection.
pub async fn post_h1(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    body: Vec<u8>,
) -> std::io::Result<(StatusCode, Bytes)> {
    let stream = connect(addr, ca_pem, &[b"http/1.1"]).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io)?;
    tokio::spawn(conn);
    send(&mut sender, path, body).await
}

pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    body: Vec<u8>,
) -> std::io::Result<(StatusCode, Bytes)> {
    sender.ready().await.map_err(io)?;
    let response = sender
        .send_request(post_request(path, body))
        .await
        .map_err(io)?;
    status_and_body(response).await
}

fn post_request(path: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

async fn status_and_body(
    response: http::Response<hyper::body::Incoming>,
) -> std::io::Result<(StatusCode, Bytes)> {
    let status = response.status();
    Ok((
        status,
        response.into_body().collect().await.map_err(io)?.to_bytes(),
    ))
}

/// One POST over HTTP/2 on a new connection; also returns the negotiated ALPN.
pub async fn post_h2(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    body: Vec<u8>,
) -> std::io::Result<(StatusCode, Bytes, Option<Vec<u8>>)> {
    let stream = connect(addr, ca_pem, &[b"h2"]).await?;
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(io)?;
    tokio::spawn(conn);
    let response = sender
        .send_request(post_request(path, body))
        .await
        .map_err(io)?;
    let (status, body) = status_and_body(response).await?;
    Ok((status, body, alpn))
}

pub fn io(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

/// A plain-HTTP GET (the admin port).
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(StatusCode, String)> {
    let tcp = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(io)?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(req).await.map_err(io)?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(io)?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A CREATE review of an opted-in pod.
pub fn review(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "test"},
            "object": {
                "metadata": {"generateName": "web-", "labels": {"sidecar-injector.io/inject": "true"}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
            }
        }
    }))
    .unwrap()
}

/// Whether a review's answer allows the pod with a patch (the opted-in pod was injected).
pub fn injected(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|v| v["response"]["allowed"] == true && v["response"]["patch"].is_string())
}

/// Keep-alive HTTP/1.1 clients posting reviews, each reconnecting when the server closes its
/// connection, as the API server's client does, and stopping for good once a connection is
/// refused (the listener has closed). Bounded: at most 5,000 requests per client.
pub struct KeepAliveClients {
    pub answered: Arc<AtomicUsize>,
    pub refused: Arc<AtomicUsize>,
    /// A request not answered with an injected review: which one, and what came instead.
    pub lost: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KeepAliveClients {
    pub fn start(addr: SocketAddr, ca: &str, clients: usize) -> Self {
        let answered = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let lost = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (ca, answered, refused, lost) = (
                ca.to_owned(),
                answered.clone(),
                refused.clone(),
                lost.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut sender = None;
                for i in 0..5_000 {
                    if sender.is_none() {
                        // Listener closed: the server was never reached.
                        let Ok(stream) = connect(addr, &ca, &[b"http/1.1"]).await else {
                            refused.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .unwrap();
                        tokio::spawn(conn);
                        sender = Some(s);
                    }
                    let s = sender.as_mut().unwrap();
                    if s.ready().await.is_err() {
                        // Closed after its last response (Connection: close): reconnect.
                        sender = None;
                        continue;
                    }
                    match send(s, "/mutate", review(&format!("{c}-{i}"))).await {
                        Ok((StatusCode::OK, body)) if injected(&body) => {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        other => {
                            lost.lock()
                                .unwrap()
                                .push(format!("client {c} request {i}: {other:?}"));
                            sender = None;
                        }
                    }
                }
            }));
        }
        Self {
            answered,
            refused,
            lost,
            tasks,
        }
    }

    /// Waits (at most 30 s) for every client to stop; how many requests were answered and
    /// refused, and the lost ones.
    pub async fn finish(self) -> (usize, usize, Vec<String>) {
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("clients finish")
                .unwrap();
        }
        let lost = std::mem::take(&mut *self.lost.lock().unwrap());
        (
            self.answered.load(Ordering::SeqCst),
            self.refused.load(Ordering::SeqCst),
            lost,
        )
    }
}

/// Polls `check` until it returns true, at most `limit`.
pub async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The real binary serving on loopback as a child process, so a test can read its memory from
/// /proc and send it signals. Killed when dropped.
pub struct ServerProcess {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub ca_pem: String,
    log: Option<std::thread::JoinHandle<String>>,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `serve` with the development certificate and `extra` flags; returns once ready.
    /// The ports are free when picked, but in the ephemeral range: another test's client may
    /// take one before the server binds it. A server that exits saying it cannot listen is
    /// started again on other ports (three tries); any other early exit fails with its log.
    pub async fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        let mut tries = 0;
        let (child, log, addr, admin) = loop {
            tries += 1;
            let (port, admin_port) = (free_port(), free_port());
            let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
                .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
                .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
                .args(["--dev-ca-file", ca_file.to_str().unwrap()])
                .args(["--log-format", "json"])
                .args(extra)
                .env("RUST_LOG", "info,sidecar_injector=debug")
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // Drain the log as it comes, or a full pipe would block the server.
            let mut stderr = child.stderr.take().unwrap();
            let log = std::thread::spawn(move || {
                let mut log = String::new();
                use std::io::Read as _;
                let _ = stderr.read_to_string(&mut log);
                log
            });
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
            let mut exited = false;
            let ready = eventually(Duration::from_secs(30), async || {
                exited = child.try_wait().unwrap().is_some();
                exited || matches!(get(admin, "/readyz").await, Ok((StatusCode::OK, _)))
            })
            .await;
            if ready && !exited {
                break (child, log, addr, admin);
            }
            let _ = child.kill();
            let _ = child.wait();
            let log = log.join().unwrap_or_default();
            if exited && tries < 3 && log.contains("cannot listen") {
                continue;
            }
            panic!("server never became ready (exited: {exited}); its log:\n{log}");
        };
        let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
        Self {
            child,
            addr,
            admin,
            ca_pem,
            log: Some(log),
            _dir: dir,
        }
    }

    /// A field of /proc/<pid>/status in KiB (`VmRSS`: resident now; `VmHWM`: the peak).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status:\n{status}"))
    }

    pub fn rss_mib(&self) -> f64 {
        self.status_kib("VmRSS") as f64 / 1024.0
    }

    pub fn peak_rss_mib(&self) -> f64 {
        self.status_kib("VmHWM") as f64 / 1024.0
    }

    /// Open file descriptors of the server (its connections among them).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(Iterator::count)
            .unwrap_or(0)
    }

    pub fn sigterm(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Sends SIGTERM while `clients` are sending, waits for them and for the exit, and asserts
    /// that the drain lost nothing: exit 0 after "drained; exiting", some requests answered
    /// and, once the listener closed, some refused, none lost. Returns the time from the
    /// signal to the exit.
    pub async fn sigterm_loses_nothing(self, clients: KeepAliveClients) -> Duration {
        let term = std::time::Instant::now();
        self.sigterm();
        let (answered, refused, lost) = clients.finish().await;
        let (status, log) = tokio::task::spawn_blocking(move || self.wait(Duration::from_secs(30)))
            .await
            .unwrap();
        let exited = term.elapsed();
        eprintln!(
            "SIGTERM: answered {answered}, refused {refused}, lost {}, exit after {exited:?}",
            lost.len()
        );
        assert!(status.success(), "exit status {status:?}\n{log}");
        assert!(log.contains("drained; exiting"), "{log}");
        assert!(
            answered > 0 && refused > 0,
            "answered {answered}, refused {refused}"
        );
        assert!(
            lost.is_empty(),
            "requests lost: answered {answered}, refused {refused}:\n{}\n{log}",
            lost.join("\n")
        );
        exited
    }

    /// Waits for the process to exit (at most `limit`); its exit status and its log.
    pub fn wait(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("server did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = self.log.take().unwrap().join().unwrap();
        (status, log)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows the end of the server's log.
        if std::thread::panicking()
            && let Some(log) = self.log.take().and_then(|l| l.join().ok())
        {
            let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("server-{}.log", self.child.id()));
            let _ = std::fs::write(&path, &log);
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "server log (last 40 lines; all in {}):\n{}",
                path.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}
