//! The server over real sockets: HTTP/1.1 and HTTP/2 by ALPN, certificate rotation without a
//! restart, configuration reload, the header-read timeout, and SIGTERM under load.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use server_support::*;
use sidecar_injector::server::Server;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

struct Running {
    server_addr: std::net::SocketAddr,
    admin_addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(extra: &[&str]) -> Running {
    install_crypto();
    let server = Server::start(serve_args(extra)).await.unwrap();
    let (server_addr, admin_addr) = (server.listen, server.admin_listen);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run_until(async move {
        let _ = stopped.await;
    }));
    Running {
        server_addr,
        admin_addr,
        stop,
        task,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_http1_and_http2_by_alpn() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki("one");
    pki.write(dir.path());
    let crt = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    let running = start(&[
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ])
    .await;

    let (status, body) = post_h1(running.server_addr, &pki.ca_pem, "/mutate", review("h1"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(injected(&body));

    let (status, body, alpn) = post_h2(running.server_addr, &pki.ca_pem, "/mutate", review("h2"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert!(injected(&body));

    // Keep-alive: several requests on one HTTP/1.1 connection.
    let stream = connect(running.server_addr, &pki.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for i in 0..5 {
        let (status, _) = send(&mut sender, "/validate", review(&format!("ka-{i}")))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
    }

    let (status, text) = get(running.admin_addr, "/readyz").await.unwrap();
    assert_eq!((status, text.as_str()), (StatusCode::OK, "ok\n"));
    let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
    assert!(
        metrics
            .contains(r#"sidecar_injector_reviews_total{webhook="mutate",outcome="injected"} 2"#),
        "{metrics}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotates_certificates_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // kubelet's layout: the files are symlinks into ..data, itself a symlink swapped atomically.
    let mount = dir.path().join("mount");
    std::fs::create_dir(&mount).unwrap();
    let generation = |n: u32, pki: &Pki| {
        let gen_dir = mount.join(format!("..gen{n}"));
        std::fs::create_dir(&gen_dir).unwrap();
        pki.write(&gen_dir);
        let tmp = mount.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..gen{n}"), &tmp).unwrap();
        std::fs::rename(&tmp, mount.join("..data")).unwrap();
    };
    let (old, new) = (pki("old"), pki("new"));
    generation(1, &old);
    std::os::unix::fs::symlink("..data/tls.crt", mount.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", mount.join("tls.key")).unwrap();
    let crt = mount.join("tls.crt");
    let key = mount.join("tls.key");
    let running = start(&[
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--reload-interval",
        "1s",
    ])
    .await;
    let addr = running.server_addr;
    assert!(
        post_h1(addr, &old.ca_pem, "/mutate", review("a"))
            .await
            .is_ok()
    );
    assert!(
        post_h1(addr, &new.ca_pem, "/mutate", review("b"))
            .await
            .is_err(),
        "new CA must not work yet"
    );

    // Requests keep flowing during the rotation; none may fail.
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (failures, done, old_ca, new_ca) = (
            failures.clone(),
            done.clone(),
            old.ca_pem.clone(),
            new.ca_pem.clone(),
        );
        tokio::spawn(async move {
            let mut sent = 0;
            while !done.load(Ordering::SeqCst) && sent < 2_000 {
                sent += 1;
                let with_old = post_h1(addr, &old_ca, "/mutate", review("r")).await;
                let with_new = post_h1(addr, &new_ca, "/mutate", review("r")).await;
                if with_old.is_err() && with_new.is_err() {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    generation(2, &new);
    let rotated = eventually(Duration::from_secs(10), async || {
        post_h1(addr, &new.ca_pem, "/mutate", review("c"))
            .await
            .is_ok()
    })
    .await;
    assert!(rotated, "new certificate not served within 10s");
    assert!(
        post_h1(addr, &old.ca_pem, "/mutate", review("d"))
            .await
            .is_err(),
        "old CA must fail after rotation"
    );
    done.store(true, Ordering::SeqCst);
    load.await.unwrap();
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "requests failed during rotation"
    );

    // A broken pair keeps the last good one and is counted.
    let broken_dir = mount.join("..gen3");
    std::fs::create_dir(&broken_dir).unwrap();
    std::fs::write(broken_dir.join("tls.crt"), &old.cert_pem).unwrap();
    std::fs::write(broken_dir.join("tls.key"), &new.key_pem).unwrap(); // key of another cert
    let tmp = mount.join("..data_tmp");
    std::os::unix::fs::symlink("..gen3", &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
    let counted = eventually(Duration::from_secs(10), async || {
        let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
        metrics.contains(r#"sidecar_injector_reloads_total{kind="certificate",result="error"} 1"#)
    })
    .await;
    assert!(counted, "failed reload not counted");
    let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"sidecar_injector_last_reload_successful{kind="certificate"} 0"#)
            && metrics.contains(r#"sidecar_injector_last_reload_successful{kind="config"} 1"#),
        "the refused certificate is not reported by the gauge: {metrics}"
    );
    assert!(
        post_h1(addr, &new.ca_pem, "/mutate", review("e"))
            .await
            .is_ok(),
        "last good certificate still served"
    );
    let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
    assert!(
        metrics
            .contains(r#"sidecar_injector_reloads_total{kind="certificate",result="success"} 1"#),
        "{metrics}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_configuration_and_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "templatesDir: .\ndefaultTemplates: [a]\n").unwrap();
    std::fs::write(
        dir.path().join("a.yaml.j2"),
        "containers:\n  - name: first\n    image: a:1\n",
    )
    .unwrap();
    let running = start(&[
        "--config",
        config.to_str().unwrap(),
        "--reload-interval",
        "1s",
        "--dev-ca-file",
        dir.path().join("ca.pem").to_str().unwrap(),
    ])
    .await;
    let ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let patch_mentions = async |word: &str| {
        let (_, body) = post_h1(running.server_addr, &ca, "/mutate", review("x"))
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let patch = v["response"]["patch"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        String::from_utf8(decoded).unwrap().contains(word)
    };
    assert!(patch_mentions("first").await);
    std::fs::write(
        dir.path().join("a.yaml.j2"),
        "containers:\n  - name: second\n    image: a:2\n",
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), async || patch_mentions("second")
            .await)
        .await,
        "template change not picked up"
    );
    std::fs::write(
        dir.path().join("a.yaml.j2"),
        "containers:\n  - name: {{ broken\n",
    )
    .unwrap();
    let counted = eventually(Duration::from_secs(10), async || {
        let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
        metrics.contains(r#"sidecar_injector_reloads_total{kind="config",result="error"} 1"#)
    })
    .await;
    assert!(counted, "broken template not reported");
    assert!(
        patch_mentions("second").await,
        "last good configuration kept"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_and_idle_connections_do_not_starve_others() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let running = start(&[
        "--header-read-timeout",
        "1s",
        "--dev-ca-file",
        ca_file.to_str().unwrap(),
    ])
    .await;
    let ca = std::fs::read_to_string(&ca_file).unwrap();
    // Many idle connections, TLS done, nothing sent.
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(
            connect(running.server_addr, &ca, &[b"http/1.1"])
                .await
                .unwrap(),
        );
    }
    // A client that never finishes its headers.
    let mut slow = connect(running.server_addr, &ca, &[b"http/1.1"])
        .await
        .unwrap();
    slow.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    // Good requests are served meanwhile.
    for i in 0..10 {
        let (status, _) = post_h1(
            running.server_addr,
            &ca,
            "/mutate",
            review(&format!("g{i}")),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    // The slow client is cut off after the header timeout (bounded wait).
    let mut buf = [0u8; 1024];
    let cut = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => break true,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert_eq!(cut.ok(), Some(true), "slow client not cut off");
    drop(idle);
    running.stop().await;
}

/// SIGTERM with clients sending: readiness fails, in-flight requests finish, no request that
/// reached the server goes unanswered, exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_nothing() {
    let server = ServerProcess::start(&["--header-read-timeout", "60s"]).await;
    let clients = KeepAliveClients::start(server.addr, &server.ca_pem, 8);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = clients.answered.load(Ordering::SeqCst);
    assert!(before > 0, "no request answered before SIGTERM");
    server.sigterm_loses_nothing(clients).await;
}

/// SIGTERM with `--shutdown-delay`: /readyz fails at once, yet new connections are still
/// accepted and answered until the delay ends (an API server whose endpoint list is a moment
/// behind is not refused); then the listener closes and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_delay_answers_new_connections_until_it_ends() {
    let server = ServerProcess::start(&["--shutdown-delay", "2s"]).await;
    let (status, _) = post_h1(server.addr, &server.ca_pem, "/mutate", review("before"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let term = std::time::Instant::now();
    server.sigterm();
    assert!(
        eventually(Duration::from_secs(1), async || {
            matches!(
                get(server.admin, "/readyz").await,
                Ok((StatusCode::SERVICE_UNAVAILABLE, _))
            )
        })
        .await,
        "/readyz did not turn 503 after SIGTERM"
    );
    // Within the delay: a new connection is accepted and its review injected.
    let (status, body) = post_h1(server.addr, &server.ca_pem, "/mutate", review("during"))
        .await
        .expect("a new connection during the shutdown delay was refused");
    assert_eq!(status, StatusCode::OK);
    assert!(injected(&body), "{}", String::from_utf8_lossy(&body));
    assert!(
        term.elapsed() < Duration::from_millis(1500),
        "the check ran too late to prove anything"
    );
    // After the delay: the listener is closed.
    assert!(
        eventually(Duration::from_secs(5), async || {
            tokio::net::TcpStream::connect(server.addr).await.is_err()
        })
        .await,
        "the listener was still open well after the delay"
    );
    assert!(
        term.elapsed() >= Duration::from_secs(2),
        "the listener closed before the delay ended"
    );
    let (status, log) = tokio::task::spawn_blocking(move || server.wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}\n{log}");
    assert!(
        log.contains("still accepting until the delay ends"),
        "{log}"
    );
}

/// Each review's log events carry its identity: a denial is logged at info with the webhook,
/// entry, uid, namespace, name, operation and outcome; an answer at debug (which the test
/// server enables for its own crate) the same way; a body that is no review at warn with its
/// webhook, entry and outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_is_logged_with_its_identity() {
    let server = ServerProcess::start(&[]).await;
    // An opted-in pod without its sidecars: the validating webhook denies it.
    let (status, body) = post_h1(server.addr, &server.ca_pem, "/validate", review("deny-me"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let (status, _) = post_h1(server.addr, &server.ca_pem, "/mutate", review("inject-me"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    // Not a review at all: refused, and logged with its webhook, entry and outcome.
    let (status, _) = post_h1(server.addr, &server.ca_pem, "/mutate", b"not json".to_vec())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.sigterm();
    let (status, log) = tokio::task::spawn_blocking(move || server.wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}\n{log}");
    let event = |message: &str| -> serde_json::Value {
        json_events(&log)
            .find(|v| v["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} event in the log:\n{log}"))
    };
    let denied = event("review denied");
    assert_eq!(denied["level"], "INFO", "{denied}");
    let answered = event("review answered");
    assert_eq!(answered["level"], "DEBUG", "{answered}");
    let unreadable = event("unreadable review");
    assert_eq!(unreadable["level"], "WARN", "{unreadable}");
    assert_eq!(
        (
            &unreadable["webhook"],
            &unreadable["entry"],
            &unreadable["outcome"]
        ),
        (&"mutate".into(), &"pod".into(), &"error".into()),
        "{unreadable}"
    );
    for (event, webhook, uid, outcome) in [
        (&denied, "validate", "deny-me", "denied"),
        (&answered, "mutate", "inject-me", "injected"),
    ] {
        assert_eq!(event["webhook"], webhook, "{event}");
        assert_eq!(event["entry"], "pod", "{event}");
        assert_eq!(event["uid"], uid, "{event}");
        assert_eq!(event["namespace"], "default", "{event}");
        // A pod still to be named: its generateName and `*`.
        assert_eq!(event["name"], "web-*", "{event}");
        assert_eq!(event["operation"], "CREATE", "{event}");
        assert_eq!(event["outcome"], outcome, "{event}");
    }
}

/// A re-check reads the watched files, and reading is no change: one write to the
/// configuration is one re-check, not the start of a loop (notify reports every open of a file
/// in a watched directory, and the server once took those for changes: ten re-checks a second,
/// for ever, on the threads that answer reviews).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_checked_once_and_reading_the_files_is_no_change() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let config_text = "templatesDir: .\ndefaultTemplates: [a]\n";
    std::fs::write(&config, config_text).unwrap();
    std::fs::write(
        dir.path().join("a.yaml.j2"),
        "containers:\n  - name: first\n    image: a:1\n",
    )
    .unwrap();
    let server = ServerProcess::start(&[
        "--config",
        config.to_str().unwrap(),
        "--reload-interval",
        "60m",
    ])
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The same bytes again: a change to look at (and nothing to reload).
    std::fs::write(&config, config_text).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.sigterm();
    let (status, log) = tokio::task::spawn_blocking(move || server.wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}\n{log}");
    let checks: Vec<serde_json::Value> = json_events(&log)
        .filter(|v| v["message"] == "re-checking the certificate and configuration files")
        .collect();
    assert!(!checks.is_empty(), "the write was not noticed:\n{log}");
    // One write can arrive as two bursts of events; a loop makes a dozen in 1.5 s.
    assert!(
        checks.len() <= 2,
        "{} re-checks after one write:\n{log}",
        checks.len()
    );
    assert!(
        checks.iter().all(|c| c["cause"] == "change notified"),
        "{checks:?}"
    );
}

/// The server's JSON log lines, parsed (anything else in the log is passed over).
fn json_events(log: &str) -> impl Iterator<Item = serde_json::Value> + '_ {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
}

/// `--policies-only` (the chart's policy-mode keeper) binds no webhook listener and needs no
/// certificate: only the admin port answers, and the policies it keeps are reported there
/// (not in step here: no cluster to apply them to). Without a policy to keep it refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_only_serves_no_webhooks() {
    install_crypto();
    let refused = Server::start(serve_args(&["--policies-only"]))
        .await
        .err()
        .unwrap();
    assert!(
        format!("{refused:#}").contains("needs a policy to keep"),
        "{refused:#}"
    );

    let running = start(&[
        "--policies-only",
        "--mutating-policy",
        "v1",
        "--reload-interval",
        "1s",
    ])
    .await;
    // `--listen 127.0.0.1:0` was never bound: a bound listener reports its port.
    assert_eq!(
        running.server_addr.port(),
        0,
        "a webhook listener was bound"
    );
    let (status, _) = get(running.admin_addr, "/readyz").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let reported = eventually(Duration::from_secs(10), async || {
        let (_, metrics) = get(running.admin_addr, "/metrics").await.unwrap();
        metrics.contains("sidecar_injector_backstop_in_step{policy=\"sidecar-injector\"} 0")
            && metrics.contains("sidecar_injector_backstop_syncs_total{result=\"error\"}")
            && !metrics.contains("policy=\"sidecar-injector-backstop\"")
    })
    .await;
    assert!(reported, "the kept policy is not reported on /metrics");
    running.stop().await;
}
