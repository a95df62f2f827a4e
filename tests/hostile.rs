//! Hostile clients against the real binary on loopback: slow headers, hundreds of idle TLS
//! connections, plain HTTP and garbage on the TLS port, HTTP/2 rapid reset and CONTINUATION
//! floods, a 100 MiB body, and SIGTERM with all of that connected. Each test keeps good
//! requests flowing meanwhile and reads the server's peak memory (VmHWM) from /proc.
//!
//! Bounded: every attack stops after a few seconds or a fixed amount of traffic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;
use server_support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// What any attack here may add to the server's peak memory. The body limit alone allows
/// 6 MiB; a 100 MiB body buffered, or state kept per reset stream, would blow through it.
const MAX_GROWTH_MIB: f64 = 48.0;

// === Good traffic ===

/// Reviews sent one after another on new connections, HTTP/1.1 and HTTP/2 in turn, until
/// stopped. Every one must be answered.
struct Good {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>, Duration)>,
}

fn good_load(addr: SocketAddr, ca: &str) -> Good {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, ca) = (stop.clone(), ca.to_owned());
    let task = tokio::spawn(async move {
        let (mut ok, mut failed, mut slowest) = (0, Vec::new(), Duration::ZERO);
        let mut i = 0;
        while !flag.load(Ordering::SeqCst) || (ok == 0 && failed.len() < 3) {
            i += 1;
            let started = Instant::now();
            let body = review(&format!("good-{i}"));
            let result = tokio::time::timeout(Duration::from_secs(5), async {
                if i % 2 == 0 {
                    post_h2(addr, &ca, "/mutate", body)
                        .await
                        .map(|(s, b, _)| (s, b))
                } else {
                    post_h1(addr, &ca, "/mutate", body).await
                }
            })
            .await;
            slowest = slowest.max(started.elapsed());
            match result {
                Ok(Ok((StatusCode::OK, body))) if injected(&body) => ok += 1,
                other => failed.push(format!("good request {i}: {other:?}")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (ok, failed, slowest)
    });
    Good { stop, task }
}

impl Good {
    /// Stops the load; asserts that every good request was answered, and returns how many.
    async fn finish(self, what: &str) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let (ok, failed, slowest) = self.task.await.unwrap();
        eprintln!("{what}: {ok} good requests answered, slowest {slowest:?}");
        assert!(
            failed.is_empty(),
            "{what}: good requests failed:\n{}",
            failed.join("\n")
        );
        assert!(ok > 0, "{what}: no good request answered");
        ok
    }
}

/// The server's resident memory once warmed up by a few good requests.
async fn baseline(server: &ServerProcess) -> f64 {
    for i in 0..4 {
        let (status, _) = post_h1(
            server.addr,
            &server.ca_pem,
            "/mutate",
            review(&format!("w{i}")),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    server.rss_mib()
}

fn assert_bounded(server: &ServerProcess, what: &str, baseline: f64) {
    let peak = server.peak_rss_mib();
    eprintln!(
        "{what}: RSS {baseline:.1} MiB before, {:.1} MiB now, peak {peak:.1} MiB",
        server.rss_mib()
    );
    assert!(
        peak - baseline < MAX_GROWTH_MIB,
        "{what}: peak RSS {peak:.1} MiB grew more than {MAX_GROWTH_MIB} MiB over {baseline:.1} MiB"
    );
}

/// Raises this process's open-file limit to its hard limit: 500 connections need 500 descriptors
/// here and 500 in the server (which inherits the limit).
fn raise_nofile(need: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|c| c < need) {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).unwrap();
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|c| c >= need),
        "open-file limit {now:?} is below the {need} this test needs (raise `ulimit -n`)"
    );
}

/// Reads until the peer closes (EOF or error); how long that took, or None after `limit`.
async fn closed_within<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = vec![0u8; 16 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

// === Slow headers ===

/// Twenty clients send their request headers one byte a second, ten in HTTP/1.1 and ten an
/// HTTP/2 connection preface: each is cut off at the header-read timeout (2s), not when it
/// finishes, while good requests are served. (The HTTP/2 preface is 24 bytes: trickled, it
/// would take 24s, and then HTTP/2 has no header-read timeout of its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_sent_one_byte_a_second_are_cut_off_at_the_header_timeout() {
    let server = ServerProcess::start(&["--header-read-timeout", "2s"]).await;
    let base = baseline(&server).await;
    let good = good_load(server.addr, &server.ca_pem);
    let mut slow = Vec::new();
    for n in 0..20 {
        let alpn: &[&[u8]] = if n % 2 == 0 { &[b"http/1.1"] } else { &[b"h2"] };
        let stream = connect(server.addr, &server.ca_pem, alpn).await.unwrap();
        slow.push(tokio::spawn(async move {
            let (mut read, mut write) = tokio::io::split(stream);
            let started = Instant::now();
            let request = if n % 2 == 0 {
                format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Slow: {n}\r\n\r\n")
            } else {
                String::from_utf8(h2frame::PREFACE.to_vec()).unwrap()
            };
            let sent = Arc::new(AtomicUsize::new(0));
            let writer = {
                let sent = sent.clone();
                tokio::spawn(async move {
                    for byte in request.bytes() {
                        if write.write_all(&[byte]).await.is_err() || write.flush().await.is_err() {
                            return;
                        }
                        sent.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                })
            };
            let cut = closed_within(&mut read, Duration::from_secs(8)).await;
            writer.abort();
            (cut, started.elapsed(), sent.load(Ordering::SeqCst))
        }));
    }
    for s in slow {
        let (cut, _, sent) = s.await.unwrap();
        let cut = cut.expect("a slow client was not cut off within 8s");
        eprintln!("slow headers: cut off after {cut:?} and {sent} bytes");
        assert!(
            cut >= Duration::from_millis(1500) && cut < Duration::from_secs(4),
            "cut off after {cut:?}, expected at the 2s header-read timeout"
        );
        assert!(
            sent <= 4,
            "{sent} bytes accepted: the timeout was reset by each byte"
        );
    }
    good.finish("slow headers").await;
    assert_bounded(&server, "slow headers", base);
}

// === Idle connections ===

/// 500 TLS connections that finish the handshake and send nothing: the server holds them
/// while good requests are answered, and closes every one at the header-read timeout, so idle
/// sockets cannot pile up until the server runs out of file descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_idle_tls_connections_are_held_then_closed() {
    raise_nofile(2_048);
    let server = ServerProcess::start(&["--header-read-timeout", "8s"]).await;
    let base = baseline(&server).await;
    let fds_before = server.open_fds();
    let started = Instant::now();
    let mut opening = tokio::task::JoinSet::new();
    for n in 0..500 {
        let (addr, ca) = (server.addr, server.ca_pem.clone());
        // Half say HTTP/1.1, half HTTP/2: an HTTP/2 connection without a preface is as idle.
        let alpn: &[&[u8]] = if n % 2 == 0 { &[b"http/1.1"] } else { &[b"h2"] };
        opening.spawn(async move { connect(addr, &ca, alpn).await });
        if n % 50 == 49 {
            // Batches, so the handshakes do not all wait on two busy cores at once.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut idle = Vec::new();
    while let Some(stream) = opening.join_next().await {
        idle.push(
            stream
                .unwrap()
                .expect("an idle connection could not be opened"),
        );
    }
    let opened_in = started.elapsed();
    let fds = server.open_fds();
    eprintln!("idle: 500 connections opened in {opened_in:?}; server fds {fds_before} -> {fds}");
    assert!(
        opened_in < Duration::from_secs(7),
        "opening took {opened_in:?}, past the timeout"
    );
    assert!(fds >= 500, "server holds {fds} fds, expected at least 500");
    let good = good_load(server.addr, &server.ca_pem);
    tokio::time::sleep(Duration::from_secs(1)).await;
    good.finish("500 idle connections").await;
    assert_bounded(&server, "500 idle connections", base);

    let mut waits = tokio::task::JoinSet::new();
    for mut stream in idle {
        waits.spawn(async move { closed_within(&mut stream, Duration::from_secs(12)).await });
    }
    let mut closed = 0;
    while let Some(cut) = waits.join_next().await {
        if cut.unwrap().is_some() {
            closed += 1;
        }
    }
    let after = server.open_fds();
    eprintln!(
        "idle: {closed} of 500 closed by the server after {:?}; fds now {after}",
        started.elapsed()
    );
    assert_eq!(
        closed, 500,
        "idle connections left open past the header-read timeout"
    );
    assert!(after < fds_before + 20, "server still holds {after} fds");
}

// === Not TLS ===

/// Plain HTTP, random bytes and a TLS record header that never completes, 50 connections each,
/// on the TLS port: each is closed (at once, or at the handshake timeout for the stalled one),
/// and good requests are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_and_random_bytes_on_the_tls_port_are_dropped() {
    let server = ServerProcess::start(&["--header-read-timeout", "2s"]).await;
    let base = baseline(&server).await;
    let good = good_load(server.addr, &server.ca_pem);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed.to_le_bytes()[0]
            })
            .collect()
    };
    let mut attacks = tokio::task::JoinSet::new();
    for n in 0..150 {
        let payload: Vec<u8> = match n % 3 {
            0 => {
                b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}".to_vec()
            }
            1 => random(64 * 1024),
            // A handshake record announcing 16 KiB, then silence.
            _ => vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01],
        };
        let addr = server.addr;
        attacks.spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let _ = tcp.write_all(&payload).await;
            let mut answer = Vec::new();
            let cut =
                tokio::time::timeout(Duration::from_secs(6), tcp.read_to_end(&mut answer)).await;
            (n % 3, cut.is_ok(), answer)
        });
    }
    let mut closed = [0; 3];
    while let Some(result) = attacks.join_next().await {
        let (kind, cut, answer) = result.unwrap();
        assert!(
            cut,
            "a non-TLS client (kind {kind}) was not disconnected within 6s"
        );
        assert!(
            !answer.windows(4).any(|w| w == b"HTTP"),
            "answered in plain HTTP on the TLS port: {:?}",
            String::from_utf8_lossy(&answer)
        );
        closed[kind] += 1;
    }
    eprintln!(
        "not TLS: closed plain HTTP {}, random {}, stalled record {}",
        closed[0], closed[1], closed[2]
    );
    good.finish("not TLS").await;
    assert_bounded(&server, "not TLS", base);
}

// === HTTP/2 by hand ===

/// Frames written by hand: an attacker does not run a well-behaved HTTP/2 client.
mod h2frame {
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const GOAWAY: u8 = 0x7;
    pub const CONTINUATION: u8 = 0x9;
    pub const END_HEADERS: u8 = 0x4;
    pub const ACK: u8 = 0x1;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap();
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend((stream & 0x7fff_ffff).to_be_bytes());
        f.extend(payload);
        f
    }

    /// HPACK for `POST https://localhost/mutate`: static-table indices and literals.
    pub fn post_mutate() -> Vec<u8> {
        let mut block = vec![0x83, 0x87, 0x04, 0x07];
        block.extend(b"/mutate");
        block.extend([0x01, 0x09]);
        block.extend(b"localhost");
        block
    }

    /// One literal header field `x: aaaa…` (not indexed) of about `len` bytes.
    pub fn filler_field(len: usize) -> Vec<u8> {
        let mut field = vec![0x00, 0x01, b'x'];
        // HPACK integer with a 7-bit prefix.
        if len < 127 {
            field.push(u8::try_from(len).unwrap());
        } else {
            field.push(0x7f);
            let mut rest = len - 127;
            while rest >= 128 {
                field.push(u8::try_from(rest % 128).unwrap() | 0x80);
                rest /= 128;
            }
            field.push(u8::try_from(rest).unwrap());
        }
        field.extend(std::iter::repeat_n(b'a', len));
        field
    }

    /// Parses frames out of `buf` (consuming whole ones); returns their (type, flags, payload).
    pub fn parse(buf: &mut Vec<u8>) -> Vec<(u8, u8, Vec<u8>)> {
        let mut frames = Vec::new();
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            frames.push((buf[3], buf[4], buf[9..9 + len].to_vec()));
            buf.drain(..9 + len);
        }
        frames
    }
}

/// What the server did to a hand-driven HTTP/2 connection.
#[derive(Debug, Default)]
struct H2Seen {
    goaway: Option<u32>,
    closed: bool,
}

type H2Attacker = (
    tokio::io::WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>,
    Arc<Mutex<H2Seen>>,
    tokio::task::JoinHandle<()>,
);

/// Opens a TLS connection with ALPN h2, exchanges prefaces and settings; returns its halves and
/// a task that reads the server's frames until it closes.
async fn h2_attacker(addr: SocketAddr, ca: &str) -> H2Attacker {
    use h2frame::*;
    let mut stream = connect(addr, ca, &[b"h2"]).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    // tokio-rustls may keep written records until flushed.
    stream.write_all(&hello).await.unwrap();
    stream.flush().await.unwrap();
    let mut buf = Vec::new();
    'settings: loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        assert!(
            n > 0,
            "the server closed a new connection before its SETTINGS"
        );
        buf.extend(&chunk[..n]);
        for (kind, flags, _) in parse(&mut buf) {
            if kind == SETTINGS && flags & ACK == 0 {
                break 'settings;
            }
        }
    }
    stream
        .write_all(&frame(SETTINGS, ACK, 0, &[]))
        .await
        .unwrap();
    stream.flush().await.unwrap();
    let (mut read, write) = tokio::io::split(stream);
    let seen = Arc::new(Mutex::new(H2Seen::default()));
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        buf.extend(&chunk[..n]);
                        for (kind, _, payload) in parse(&mut buf) {
                            if kind == GOAWAY && payload.len() >= 8 {
                                let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                                seen.lock().unwrap().goaway = Some(code);
                            }
                        }
                    }
                }
            }
            seen.lock().unwrap().closed = true;
        })
    };
    (write, seen, reader)
}

/// Rapid reset (CVE-2023-44487): HEADERS then RST_STREAM, as fast as the socket takes them,
/// on a connection after another for 2 seconds (at most 200,000 streams each). The server must
/// end each connection with GOAWAY ENHANCE_YOUR_CALM, keep its memory flat, and answer good
/// requests meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_reset_is_cut_off() {
    use h2frame::*;
    let server = ServerProcess::start(&["--header-read-timeout", "2s"]).await;
    let base = baseline(&server).await;
    let good = good_load(server.addr, &server.ca_pem);
    let block = post_mutate();
    let started = Instant::now();
    let (mut connections, mut total) = (0, 0);
    while started.elapsed() < Duration::from_secs(2) {
        let (mut write, seen, reader) = h2_attacker(server.addr, &server.ca_pem).await;
        let mut stream_id: u32 = 1;
        let mut streams = 0;
        while streams < 200_000 {
            let mut batch = Vec::new();
            for _ in 0..100 {
                batch.extend(frame(HEADERS, END_HEADERS, stream_id, &block));
                batch.extend(frame(RST_STREAM, 0, stream_id, &8u32.to_be_bytes())); // CANCEL
                stream_id += 2;
                streams += 1;
            }
            if write.write_all(&batch).await.is_err() || seen.lock().unwrap().closed {
                break;
            }
        }
        let cut = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .is_ok();
        let goaway = seen.lock().unwrap().goaway;
        // ENHANCE_YOUR_CALM (0xb): the server noticed the resets and closed the connection.
        assert_eq!(
            goaway,
            Some(0xb),
            "no GOAWAY ENHANCE_YOUR_CALM after {streams} resets"
        );
        assert!(
            cut,
            "the attacking connection stayed open after {streams} resets"
        );
        connections += 1;
        total += streams;
    }
    eprintln!(
        "rapid reset: {connections} connections, {total} streams written and reset in {:?}, each connection ended by GOAWAY ENHANCE_YOUR_CALM",
        started.elapsed()
    );
    good.finish("rapid reset").await;
    assert_bounded(&server, "rapid reset", base);
}

/// CONTINUATION flood (CVE-2024-27316 class): a HEADERS frame without END_HEADERS followed by
/// CONTINUATION frames that never end, 16 KiB each or empty, at most 64 MiB or 5 seconds per
/// connection, one connection after another for 2 seconds. Nothing may be buffered without
/// bound, and every such connection must be closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_endless_continuation_frames_are_cut_off() {
    use h2frame::*;
    let server = ServerProcess::start(&["--header-read-timeout", "2s"]).await;
    let base = baseline(&server).await;
    let good = good_load(server.addr, &server.ca_pem);
    let kinds = [("16 KiB", filler_field(16_000)), ("empty", Vec::new())];
    let started_all = Instant::now();
    let mut connections = 0;
    while started_all.elapsed() < Duration::from_secs(2) {
        let (what, field) = kinds[connections % 2].clone();
        connections += 1;
        let (mut write, seen, reader) = h2_attacker(server.addr, &server.ca_pem).await;
        let started = Instant::now();
        let mut sent = 0usize;
        let mut frames = 0usize;
        write
            .write_all(&frame(HEADERS, 0, 1, &post_mutate()))
            .await
            .unwrap();
        let one = frame(CONTINUATION, 0, 1, &field);
        let batch: Vec<u8> = std::iter::repeat_n(one, 64).flatten().collect();
        while started.elapsed() < Duration::from_secs(5) && sent < 64 << 20 {
            if write.write_all(&batch).await.is_err() || seen.lock().unwrap().closed {
                break;
            }
            sent += batch.len();
            frames += 64;
        }
        let elapsed = started.elapsed();
        let cut = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .is_ok();
        let seen = seen.lock().unwrap();
        if connections <= 2 {
            eprintln!(
                "continuation ({what}): {frames} frames, {} KiB in {elapsed:?}; GOAWAY {:?}, closed {cut}",
                sent / 1024,
                seen.goaway
            );
        }
        assert!(cut, "continuation ({what}): the connection was not closed");
        assert!(
            elapsed < Duration::from_secs(5),
            "continuation ({what}): the server read frames for the whole 5s"
        );
    }
    eprintln!(
        "continuation: {connections} attacking connections in {:?}, each closed",
        started_all.elapsed()
    );
    good.finish("continuation").await;
    assert_bounded(&server, "continuation", base);
}

// === Large body ===

/// 100 MiB offered two ways, with a Content-Length and chunked, against a 1 MiB limit: both
/// get 413 without the server reading (or keeping) the rest, and its memory stays flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_body_is_refused_at_the_limit_without_buffering() {
    let server = ServerProcess::start(&["--max-body-bytes", "1048576"]).await;
    let base = baseline(&server).await;
    let good = good_load(server.addr, &server.ca_pem);
    const TOTAL: usize = 100 << 20;
    for chunked in [false, true] {
        let stream = connect(server.addr, &server.ca_pem, &[b"http/1.1"])
            .await
            .unwrap();
        let (mut read, mut write) = tokio::io::split(stream);
        let head = if chunked {
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_owned()
        } else {
            format!("POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {TOTAL}\r\n\r\n")
        };
        let sender = tokio::spawn(async move {
            let block = vec![b' '; 64 * 1024];
            let mut framed = Vec::new();
            if chunked {
                framed.extend(format!("{:x}\r\n", block.len()).as_bytes());
            }
            framed.extend(&block);
            if chunked {
                framed.extend(b"\r\n");
            }
            write.write_all(head.as_bytes()).await.unwrap();
            let mut sent = 0;
            while sent < TOTAL {
                if write.write_all(&framed).await.is_err() {
                    break;
                }
                sent += block.len();
            }
            sent
        });
        let mut answer = Vec::new();
        let read_all =
            tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut answer)).await;
        let sent = tokio::time::timeout(Duration::from_secs(20), sender)
            .await
            .expect("the sender never stopped")
            .unwrap();
        let text = String::from_utf8_lossy(&answer);
        eprintln!(
            "100 MiB body (chunked: {chunked}): {} MiB sent before the server stopped reading; answer {:?}",
            sent >> 20,
            text.lines().next()
        );
        assert!(read_all.is_ok(), "the connection was not closed");
        assert!(
            text.starts_with("HTTP/1.1 413"),
            "expected 413, got {text:?}"
        );
        assert!(sent < TOTAL, "the server read all 100 MiB");
    }
    good.finish("100 MiB body").await;
    assert_bounded(&server, "100 MiB body", base);
}

// === SIGTERM ===

/// SIGTERM while clients send on keep-alive connections and hostile ones hold idle, slow and
/// half-sent connections open: every request that reached the server is answered, the hostile
/// connections hold the drain up no longer than the request timeout, and the process exits 0.
/// (tests/server_tls.rs covers the plain case.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_hostile_clients_connected_loses_nothing() {
    let server = ServerProcess::start(&[
        "--header-read-timeout",
        "30s",
        "--request-timeout",
        "3s",
        "--shutdown-timeout",
        "20s",
    ])
    .await;
    let (addr, ca) = (server.addr, server.ca_pem.clone());
    let base = baseline(&server).await;
    // Hostile: idle, slow headers, a body that stops halfway.
    let mut hostile = Vec::new();
    for n in 0..60 {
        let mut s = connect(addr, &ca, &[b"http/1.1"]).await.unwrap();
        match n % 3 {
            0 => {}
            1 => s
                .write_all(b"POST /mutate HTTP/1.1\r\nHost: loc")
                .await
                .unwrap(),
            _ => s
                .write_all(
                    b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{\"a",
                )
                .await
                .unwrap(),
        }
        s.flush().await.unwrap();
        hostile.push(s);
    }
    let clients = KeepAliveClients::start(addr, &ca, 6);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        clients.answered.load(Ordering::SeqCst) > 0,
        "no request answered before SIGTERM"
    );
    // Read before the signal: once drained, the process is gone.
    assert_bounded(&server, "SIGTERM", base);
    let exited = server.sigterm_loses_nothing(clients).await;
    // A body that stopped halfway holds the drain until --request-timeout (3s) answers it 408;
    // idle and slow-header connections are closed after a second of quiet.
    assert!(
        exited < Duration::from_secs(6),
        "the hostile connections held the drain for {exited:?}"
    );
    drop(hostile);
}
