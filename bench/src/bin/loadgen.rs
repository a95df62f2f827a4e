//! The load generator: POSTs the bench's AdmissionReview over TLS to a server on 127.0.0.1,
//! over a fixed number of keep-alive connections (HTTP/1.1, or HTTP/2 with several streams per
//! connection), for a fixed time, and prints one JSON line (`LoadReport`).
//!
//! Closed loop (no `--rate`): every worker sends its next request as soon as the answer to the
//! previous one is read; requests per second at saturation.
//! Open loop (`--rate R`): request i is due at `start + i/R`, whoever is free sends it, and its
//! latency runs from when it was due, not from when it was sent, so a slow answer that holds up
//! the next requests is charged to them too (no coordinated omission). The open loop runs on one
//! thread whose reactor also keeps the schedule (a timerfd armed for the next due request, to
//! the nanosecond): a due request wakes the thread that sends it, with no pacing thread and no
//! wake-up from one thread to another per request, so the generator takes as little as it can
//! of the two cores it shares with the server it measures.
//!
//! Open loop against several servers (`--addr` given more than once): one schedule at `--rate`,
//! cut into slices of `--slice-ms` that go to the servers in turn (A, B, A, B, ...), each server
//! over connections of its own that stay open the whole run. Each server gets the same number
//! of slots, all at the rate asked for, and the same moments of the machine: whatever else runs
//! on it for a second falls on all of them alike, where separate runs one after another would
//! give it to whichever ran then. One report line per server, in the order given.
//!
//! Every answer is checked (`check_answer`): only a 200 that allows the request's uid with a
//! non-empty JSONPatch counts; any other 200 is counted as `invalid`, so a server that answers
//! errors fast does not look fast.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sidecar_injector_bench::{
    LoadReport, check_answer, client_config, numbered_uid, percentile_ms, request_uid, review_body,
    server_name,
};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

/// How long past its schedule an open-loop run may go on answering.
const GIVE_UP_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug, Parser)]
struct Args {
    /// Server address; must be on loopback. Given more than once (open loop only): the servers
    /// take the schedule's slices in turn, one report line each.
    #[arg(long, required = true)]
    addr: Vec<SocketAddr>,
    /// With several `--addr`: the length of each server's turn, in milliseconds of the schedule.
    /// The warm-up and the measured time are then each rounded up to whole rounds of turns
    /// (every server its turn), and `--duration` is all servers' time together.
    #[arg(long, default_value_t = 100.0)]
    slice_ms: f64,
    /// CA certificate (PEM) the server's certificate must chain to. With several `--addr`, one
    /// for all or one for each, in the same order.
    #[arg(long, required = true)]
    ca: Vec<PathBuf>,
    #[arg(long, default_value = "/mutate")]
    path: String,
    /// The AdmissionReview to send (JSON, sent as is). Default: bench/review.json, compact.
    #[arg(long)]
    body: Option<PathBuf>,
    /// Send `--body` compact, as an API server writes a review: no whitespace between tokens,
    /// members in their order.
    #[arg(long)]
    compact: bool,
    /// Append this many env vars to every container of the body (every seventh from a
    /// ConfigMap): large pods for training the profile-guided build (tools/pgo-build.sh).
    #[arg(long, default_value_t = 0)]
    pad_env: usize,
    /// 1 (HTTP/1.1) or 2 (HTTP/2), negotiated by ALPN.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    http: u8,
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Concurrent requests per connection (HTTP/2 only).
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Requests per second, sent at fixed intervals (open loop). Without it: closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Threads of the generator's runtime in a closed loop (an open loop runs on one).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also write every measured latency to this file (nanoseconds, u64 little-endian, sorted),
    /// for a caller that pools several runs. With several `--addr`, one file for each, in the
    /// same order.
    #[arg(long)]
    latencies: Vec<PathBuf>,
    /// Open loop: write each answered measured request as three u64 little-endian values, in
    /// schedule order: its slot, how late it was sent after it was due, and its latency (ns).
    /// With several `--addr`, one file for each, in the same order (the slots are the shared
    /// schedule's: a server's turn is `--slice-ms` of them in a row).
    #[arg(long)]
    timeline: Vec<PathBuf>,
    /// Send the body's own uid on every request. Without it every request gets a uid of its
    /// own, as the API server gives each: the body's uid with its last (up to 12) characters
    /// replaced by the request's number in hexadecimal, so the body keeps its length.
    #[arg(long)]
    fixed_uid: bool,
    /// Send the body's own service account token volume name (`kube-api-access-` and five
    /// characters, wherever it is written) on every request. Without it every request gets a
    /// name of its own, as the API server's ServiceAccount admission gives every pod that
    /// mounts a token (the webhook's memory of answers leaves that name's suffix out, where
    /// the pod names its token volume); with it, requests are alike but for the uid.
    #[arg(long)]
    fixed_token: bool,
    /// Send the replicas of this many workloads in turn: request n belongs to workload
    /// n % WORKLOADS, whose pods carry a `pod-template-hash` of their own (the body's, wherever
    /// it is written, replaced by the workload's number in the alphabet of Kubernetes' random
    /// names, as long). 1: one workload.
    #[arg(long, default_value_t = 1)]
    workloads: u64,
    /// Send one request, check it is a 200 AdmissionReview that allows with a JSONPatch, and
    /// print what came back.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    ensure!(
        args.addr.iter().all(|a| a.ip().is_loopback()),
        "load goes to loopback only"
    );
    ensure!(
        args.ca.len() == 1 || args.ca.len() == args.addr.len(),
        "--ca: one for all servers, or one for each --addr"
    );
    ensure!(
        args.latencies.is_empty() || args.latencies.len() == args.addr.len(),
        "--latencies: one file for each --addr"
    );
    ensure!(
        args.timeline.is_empty() || args.timeline.len() == args.addr.len(),
        "--timeline: one file for each --addr"
    );
    if args.addr.len() > 1 {
        ensure!(
            args.rate.is_some() && !args.check,
            "several --addr need --rate, and cannot go with --check"
        );
        ensure!(
            args.slice_ms >= 1.0 && args.slice_ms <= 10_000.0,
            "--slice-ms [1, 10000]"
        );
    }
    ensure!(
        (1..=1024).contains(&args.connections),
        "--connections 1..=1024"
    );
    ensure!((1..=256).contains(&args.streams), "--streams 1..=256");
    ensure!(
        args.http == 2 || args.streams == 1,
        "--streams needs --http 2"
    );
    ensure!(
        args.duration > 0.0 && args.duration <= 600.0,
        "--duration (0, 600]"
    );
    ensure!((0.0..=30.0).contains(&args.warmup), "--warmup [0, 30]");
    ensure!(args.workloads >= 1, "--workloads 1 or more");
    if let Some(rate) = args.rate {
        ensure!(rate > 0.0 && rate <= 1e6, "--rate (0, 1e6]");
    }
    let runtime = if args.rate.is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads.max(1))
            .enable_all()
            .build()?
    };
    let targets = args
        .addr
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            Target::new(&args, addr, &args.ca[i.min(args.ca.len() - 1)]).map(Arc::new)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let report = runtime.block_on(async {
        if args.check {
            return check(&targets[0]).await;
        }
        // Past this, whatever is still running is abandoned: the run ends by itself.
        // (Several servers: warm-up and duration each rounded up to whole rounds of turns.)
        let rounding = if args.addr.len() > 1 {
            2.0 * args.addr.len() as f64 * args.slice_ms / 1e3
        } else {
            0.0
        };
        let bound = Duration::from_secs_f64(args.warmup + args.duration + rounding + 30.0);
        match tokio::time::timeout(bound, run(&args, targets)).await {
            Ok(report) => report,
            Err(_) => bail!("load run did not finish within {bound:?}"),
        }
    })?;
    println!("{report}");
    // Connections still open are dropped with the runtime.
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

/// Where requests go and what they carry.
struct Target {
    addr: SocketAddr,
    http: u8,
    connector: TlsConnector,
    uri: Uri,
    host: HeaderValue,
    body: Bytes,
    /// The body's uid, and where its text is in the body.
    uid: String,
    uid_at: std::ops::Range<usize>,
    fixed_uid: bool,
    /// Where the five characters after each `kube-api-access-` are (none with --fixed-token).
    token_at: Vec<usize>,
    /// Where the body's `pod-template-hash` is written, and how long it is (none with one
    /// workload).
    hash_at: Vec<usize>,
    hash_len: usize,
    workloads: u64,
    /// Requests numbered so far (each one's uid and token name are made from its number).
    sent: std::sync::atomic::AtomicU64,
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Target {
    fn new(args: &Args, addr: SocketAddr, ca: &std::path::Path) -> anyhow::Result<Self> {
        let alpn: &[u8] = if args.http == 2 { b"h2" } else { b"http/1.1" };
        let connector = TlsConnector::from(Arc::new(client_config(ca, alpn)?));
        let authority = addr.to_string();
        // HTTP/2 carries scheme and authority in the request; HTTP/1.1 sends the path and a Host.
        let uri: Uri = if args.http == 2 {
            format!("https://{authority}{}", args.path).parse()?
        } else {
            args.path.parse()?
        };
        let body = match &args.body {
            Some(path) => std::fs::read(path).with_context(|| path.display().to_string())?,
            None => review_body()?,
        };
        let body = if args.pad_env > 0 {
            pad_env(&body, args.pad_env)?
        } else if args.compact {
            let review: serde_json::Value =
                serde_json::from_slice(&body).context("--body is not JSON")?;
            serde_json::to_vec(&review)?
        } else {
            body
        };
        let uid = request_uid(&body)?;
        ensure!(
            args.fixed_uid
                || (!uid.is_empty()
                    && uid
                        .bytes()
                        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')),
            "the body's request.uid must be printable ASCII without quotes or backslashes to be numbered (or give --fixed-uid)"
        );
        // The request's uid is the first place its text is written, as a JSON string.
        let quoted = serde_json::to_vec(&uid)?;
        let start = memchr::memmem::find(&body, &quoted)
            .context("the body's request.uid is not written as it reads")?
            + 1;
        let token_at = if args.fixed_token {
            Vec::new()
        } else {
            token_names(&body)
        };
        let (hash_at, hash_len) = if args.workloads > 1 {
            let review: serde_json::Value = serde_json::from_slice(&body)?;
            let hash = review["request"]["object"]["metadata"]["labels"]["pod-template-hash"]
                .as_str()
                .filter(|h| !h.is_empty())
                .context("--workloads needs a body whose pod has a pod-template-hash label")?
                .to_owned();
            ensure!(
                args.workloads <= (TOKEN_ALPHABET.len() as u64).saturating_pow(hash.len() as u32),
                "--workloads: more than the pod-template-hash's length can number"
            );
            let at = memchr::memmem::find_iter(&body, hash.as_bytes()).collect();
            (at, hash.len())
        } else {
            (Vec::new(), 0)
        };
        Ok(Self {
            hash_at,
            hash_len,
            workloads: args.workloads,
            token_at,
            addr,
            http: args.http,
            connector,
            uri,
            host: HeaderValue::from_str(&authority)?,
            uid_at: start..start + quoted.len() - 2,
            uid,
            fixed_uid: args.fixed_uid,
            sent: std::sync::atomic::AtomicU64::new(0),
            body: Bytes::from(body),
        })
    }

    /// The next request's body and the uid its answer must echo.
    fn next(&self) -> (Bytes, String) {
        if self.fixed_uid && self.token_at.is_empty() && self.hash_at.is_empty() {
            return (self.body.clone(), self.uid.clone());
        }
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        let mut body = self.body.to_vec();
        let uid = if self.fixed_uid {
            self.uid.clone()
        } else {
            let uid = numbered_uid(&self.uid, n);
            body[self.uid_at.clone()].copy_from_slice(uid.as_bytes());
            uid
        };
        let token = token_suffix(n);
        for &at in &self.token_at {
            body[at..at + TOKEN_SUFFIX].copy_from_slice(&token);
        }
        if !self.hash_at.is_empty() {
            let hash = in_alphabet(n % self.workloads, self.hash_len);
            for &at in &self.hash_at {
                body[at..at + self.hash_len].copy_from_slice(&hash);
            }
        }
        (Bytes::from(body), uid)
    }

    async fn connect(&self) -> anyhow::Result<Sender> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.connector.connect(server_name(), tcp).await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let io = TokioIo::new(tls);
        if self.http == 2 {
            ensure!(alpn.as_deref() == Some(b"h2"), "server did not agree to h2");
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Ok(Sender::H2(sender))
        } else {
            ensure!(
                alpn.as_deref() == Some(b"http/1.1"),
                "server did not agree to http/1.1"
            );
            let (sender, conn) = http1::handshake(io).await?;
            tokio::spawn(conn);
            Ok(Sender::H1(sender))
        }
    }

    /// Sends one review and reads the whole answer.
    async fn send(&self, sender: &mut Sender, body: Bytes) -> anyhow::Result<Bytes> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let response = match sender {
            Sender::H1(s) => {
                request
                    .headers_mut()
                    .insert(header::HOST, self.host.clone());
                s.ready().await?;
                s.send_request(request).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(request).await?
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("status {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

/// One request; fails unless the answer allows the pod with a JSONPatch for the request's uid.
async fn check(target: &Target) -> anyhow::Result<String> {
    let mut sender = target.connect().await?;
    let (request, uid) = target.next();
    let body = target.send(&mut sender, request).await?;
    let patch = check_answer(&body, &uid).with_context(|| {
        let text = String::from_utf8_lossy(&body);
        let end = text
            .char_indices()
            .nth(2_000)
            .map_or(text.len(), |(i, _)| i);
        format!("answer: {}", &text[..end])
    })?;
    Ok(serde_json::json!({
        "status": 200,
        "bytes": body.len(),
        "patch_base64_bytes": patch,
    })
    .to_string())
}

#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    invalid: u64,
    unsent: u64,
    latencies_ns: Vec<u64>,
    /// Open loop: each measured request's slot, how late it was sent and its latency (ns).
    timeline: Vec<[u64; 3]>,
    last_done: Option<Instant>,
}

/// When the next open-loop request is due, and to which server: the pacer adds one permit to a
/// server's semaphore for each of its slots that falls due.
struct Pace {
    /// One semaphore per server.
    permits: Vec<Semaphore>,
    /// Each server's slots taken so far (its k-th slot is [`Pace::slot`]`(server, k)`).
    next: Vec<AtomicUsize>,
    start: Instant,
    interval_ns: f64,
    /// Slots in the whole schedule, all servers'.
    total: usize,
    /// Slots in one server's turn; with one server, the whole schedule.
    per_slice: usize,
    warmup_slots: usize,
    /// Requests still waiting for a free worker this long after the last one was due are not
    /// sent: the server is far behind, and the run must end in bounded time.
    give_up: Instant,
    /// Whether each answered request's slot, send lag and latency are kept (`--timeline`).
    timeline: bool,
}

impl Pace {
    fn due(&self, slot: usize) -> Instant {
        self.start + Duration::from_nanos((slot as f64 * self.interval_ns) as u64)
    }

    /// How many slots are due at `now`, counting on from `released` (all slots before it are
    /// known to be due): slot i is due at `due(i)`.
    fn due_by(&self, released: usize, now: Instant) -> usize {
        let mut due = released;
        while due < self.total && self.due(due) <= now {
            due += 1;
        }
        due
    }

    fn servers(&self) -> usize {
        self.permits.len()
    }

    /// The server whose turn holds `slot`.
    fn server_of(&self, slot: usize) -> usize {
        slot / self.per_slice % self.servers()
    }

    /// Server `server`'s `k`-th slot in the schedule.
    fn slot(&self, server: usize, k: usize) -> usize {
        (k / self.per_slice * self.servers() + server) * self.per_slice + k % self.per_slice
    }

    /// How many slots each server has (the schedule is whole turns of every server).
    fn each(&self) -> usize {
        self.total / self.servers()
    }
}

/// A timerfd on the runtime's reactor: wakes its task at an `Instant`, to the nanosecond.
struct Alarm {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    /// The same moment as an `Instant` and on CLOCK_MONOTONIC (which `Instant` reads on Linux).
    anchor: (Instant, Duration),
}

impl Alarm {
    fn new() -> anyhow::Result<Self> {
        use rustix::time::{ClockId, TimerfdClockId, TimerfdFlags, clock_gettime, timerfd_create};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .context("timerfd_create")?;
        let instant = Instant::now();
        let now = clock_gettime(ClockId::Monotonic);
        let monotonic = Duration::new(
            u64::try_from(now.tv_sec).context("clock before its epoch")?,
            u32::try_from(now.tv_nsec).context("clock nanoseconds")?,
        );
        // `AsyncFd::new` is deprecated because a registered descriptor could be closed or
        // replaced behind the reactor's back; this one is an `OwnedFd` the `AsyncFd` owns and
        // nothing else can reach, and the safe constructor is the only one `forbid(unsafe_code)`
        // allows.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd)?;
        Ok(Self {
            fd,
            anchor: (instant, monotonic),
        })
    }

    /// Returns at `at` or soon after (at once if it has passed).
    async fn wait_until(&self, at: Instant) -> std::io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let (instant, monotonic) = self.anchor;
        // An instant before the anchor is in the past: the anchor itself fires at once too.
        let when = monotonic + at.saturating_duration_since(instant);
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: i64::try_from(when.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(when.subsec_nanos()),
            },
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::ABSTIME, &spec)?;
        loop {
            let mut guard = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(result) => return result.map(drop),
                Err(_would_block) => {}
            }
        }
    }
}

async fn run(args: &Args, targets: Vec<Arc<Target>>) -> anyhow::Result<String> {
    let servers = targets.len();
    // Each worker with the server it sends to.
    let mut senders = Vec::new();
    for (server, target) in targets.iter().enumerate() {
        for _ in 0..args.connections {
            let sender = target.connect().await?;
            // HTTP/2 streams share their connection; an HTTP/1.1 connection has one worker.
            if let Sender::H2(shared) = &sender {
                for _ in 1..args.streams {
                    senders.push((server, Sender::H2(shared.clone())));
                }
            }
            senders.push((server, sender));
        }
    }
    let workers = senders.len();
    let warmup = Duration::from_secs_f64(args.warmup);
    let duration = Duration::from_secs_f64(args.duration);
    // The measured part of the schedule (several servers: rounded up to whole rounds of turns).
    let mut measure_for = duration;
    let mut tasks = Vec::with_capacity(workers);
    // The open loop's pacing task, which fails the run if it cannot keep the schedule.
    let mut pacer = None;
    let measure_from = match args.rate {
        None => {
            let measure_from = Instant::now() + warmup;
            let end = measure_from + duration;
            for (server, sender) in senders {
                let target = targets[server].clone();
                let task = closed_worker(target, sender, measure_from, end);
                tasks.push((server, tokio::spawn(task)));
            }
            None
        }
        Some(rate) => {
            let interval_ns = 1e9 / rate;
            let start = Instant::now() + Duration::from_millis(5);
            let mut total = (rate * (args.warmup + args.duration)).round() as usize;
            let mut warmup_slots = (rate * args.warmup).round() as usize;
            let per_slice = if servers == 1 {
                total.max(1)
            } else {
                // Warm-up and measurement each in whole rounds of turns, so that every server
                // gets as many slots of each.
                let per_slice = ((rate * args.slice_ms / 1e3).round() as usize).max(1);
                let round = servers * per_slice;
                let measured = ((rate * args.duration).round() as usize).div_ceil(round) * round;
                warmup_slots = warmup_slots.div_ceil(round) * round;
                total = warmup_slots + measured;
                measure_for = Duration::from_secs_f64(measured as f64 / rate);
                per_slice
            };
            let pace = Arc::new(Pace {
                permits: (0..servers).map(|_| Semaphore::new(0)).collect(),
                next: (0..servers).map(|_| AtomicUsize::new(0)).collect(),
                start,
                give_up: start + Duration::from_secs_f64(total as f64 / rate) + GIVE_UP_AFTER,
                interval_ns,
                total,
                per_slice,
                warmup_slots,
                timeline: !args.timeline.is_empty(),
            });
            for (server, sender) in senders {
                let task = open_worker(targets[server].clone(), sender, pace.clone(), server);
                tasks.push((server, tokio::spawn(task)));
            }
            // Not a tokio timer: its wheel ticks in milliseconds, which would bunch sends
            // together and add up to a millisecond to every measured latency.
            let alarm = Alarm::new()?;
            let handle = tokio::spawn(async move {
                let mut released = 0;
                let paced = async {
                    while released < pace.total {
                        let due = pace.due_by(released, Instant::now());
                        if due > released {
                            for (server, permits) in pace.permits.iter().enumerate() {
                                let n = (released..due)
                                    .filter(|&slot| pace.server_of(slot) == server)
                                    .count();
                                if n > 0 {
                                    permits.add_permits(n);
                                }
                            }
                            released = due;
                            // Let the workers send what is due before looking at the clock again.
                            tokio::task::yield_now().await;
                        } else {
                            alarm.wait_until(pace.due(released)).await?;
                        }
                    }
                    Ok::<_, std::io::Error>(())
                };
                let result = paced.await;
                for permits in &pace.permits {
                    if result.is_ok() {
                        // Wake every worker once more so each sees that no slot is left.
                        permits.add_permits(workers);
                    } else {
                        // Without its clock the schedule cannot be kept: the workers stop, the
                        // run fails.
                        permits.close();
                    }
                }
                result
            });
            pacer = Some(handle);
            Some(start + Duration::from_secs_f64(warmup_slots as f64 / rate))
        }
    };
    let mut tallies: Vec<Tally> = (0..servers).map(|_| Tally::default()).collect();
    for (server, task) in tasks {
        let t = task.await?;
        let tally = &mut tallies[server];
        tally.ok += t.ok;
        tally.errors += t.errors;
        tally.invalid += t.invalid;
        tally.unsent += t.unsent;
        tally.latencies_ns.extend(t.latencies_ns);
        tally.timeline.extend(t.timeline);
        tally.last_done = tally.last_done.max(t.last_done);
    }
    if let Some(pacer) = pacer {
        pacer.await?.context("the open loop's timer failed")?;
    }
    let mut lines = Vec::with_capacity(servers);
    for (server, mut tally) in tallies.into_iter().enumerate() {
        if let Some(path) = args.timeline.get(server) {
            let mut timeline = std::mem::take(&mut tally.timeline);
            timeline.sort_unstable();
            let bytes: Vec<u8> = timeline
                .iter()
                .flatten()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            std::fs::write(path, bytes).with_context(|| path.display().to_string())?;
        }
        let mut lat = tally.latencies_ns;
        lat.sort_unstable();
        if let Some(path) = args.latencies.get(server) {
            let bytes: Vec<u8> = lat.iter().flat_map(|ns| ns.to_le_bytes()).collect();
            std::fs::write(path, bytes).with_context(|| path.display().to_string())?;
        }
        // The open loop's window ends with its last answer: a server that falls behind answers
        // the same number of requests over a longer time. With several servers, each one's
        // share of it (its turns), so that its rate reads as the rate it was sent at.
        let seconds = match (measure_from, tally.last_done) {
            (Some(from), Some(last)) if args.rate.is_some() => {
                last.saturating_duration_since(from)
                    .max(measure_for)
                    .as_secs_f64()
                    / servers as f64
            }
            _ => measure_for.as_secs_f64(),
        };
        let report = LoadReport {
            mode: if args.rate.is_some() {
                "open"
            } else {
                "closed"
            }
            .into(),
            http: args.http,
            connections: args.connections,
            streams: args.streams,
            offered_rps: args.rate,
            requests: tally.ok,
            errors: tally.errors,
            invalid: tally.invalid,
            unsent: tally.unsent,
            seconds,
            rps: tally.ok as f64 / seconds,
            p50_ms: percentile_ms(&lat, 0.50),
            p90_ms: percentile_ms(&lat, 0.90),
            p99_ms: percentile_ms(&lat, 0.99),
            p999_ms: percentile_ms(&lat, 0.999),
            max_ms: percentile_ms(&lat, 1.0),
        };
        lines.push(serde_json::to_string(&report)?);
    }
    Ok(lines.join("\n"))
}

async fn closed_worker(
    target: Arc<Target>,
    mut sender: Sender,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        let (request, uid) = target.next();
        let result = target.send(&mut sender, request).await;
        let done = Instant::now();
        match result {
            Ok(answer) if check_answer(&answer, &uid).is_err() => tally.invalid += 1,
            Ok(_) if done >= measure_from && done <= end => {
                tally.ok += 1;
                tally.latencies_ns.push(nanos(done - sent));
            }
            Ok(_) => {}
            Err(_) => {
                tally.errors += 1;
                sender = reconnect(&target, sender).await;
            }
        }
    }
    tally
}

async fn open_worker(
    target: Arc<Target>,
    mut sender: Sender,
    pace: Arc<Pace>,
    server: usize,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let Ok(permit) = pace.permits[server].acquire().await else {
            break;
        };
        permit.forget();
        let k = pace.next[server].fetch_add(1, Ordering::Relaxed);
        if k >= pace.each() {
            break;
        }
        let slot = pace.slot(server, k);
        let due = pace.due(slot);
        let now = Instant::now();
        if now > pace.give_up {
            // Charged as if answered now: a lower bound of what it would have taken.
            tally.unsent += 1;
            if slot >= pace.warmup_slots {
                tally
                    .latencies_ns
                    .push(nanos(now.saturating_duration_since(due)));
            }
            continue;
        }
        let (request, uid) = target.next();
        let result = target.send(&mut sender, request).await;
        let done = Instant::now();
        match result {
            Ok(answer) if check_answer(&answer, &uid).is_err() => tally.invalid += 1,
            Ok(_) if slot >= pace.warmup_slots => {
                tally.ok += 1;
                if pace.timeline {
                    tally.timeline.push([
                        slot as u64,
                        nanos(now.saturating_duration_since(due)),
                        nanos(done.saturating_duration_since(due)),
                    ]);
                }
                tally
                    .latencies_ns
                    .push(nanos(done.saturating_duration_since(due)));
                tally.last_done = Some(done);
            }
            Ok(_) => {}
            Err(_) => {
                tally.errors += 1;
                sender = reconnect(&target, sender).await;
            }
        }
    }
    tally
}

/// A fresh connection after a failure; the old sender if none can be had (pausing briefly, so a
/// dead server is not hammered).
async fn reconnect(target: &Target, old: Sender) -> Sender {
    match target.connect().await {
        Ok(sender) => sender,
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(10)).await;
            old
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `body` with `count` env vars appended to each of its pod's containers.
fn pad_env(body: &[u8], count: usize) -> anyhow::Result<Vec<u8>> {
    let mut review: serde_json::Value =
        serde_json::from_slice(body).context("--body is not JSON")?;
    let containers = review["request"]["object"]["spec"]["containers"]
        .as_array_mut()
        .context("--pad-env: the body has no request.object.spec.containers")?;
    for container in containers {
        if !container["env"].is_array() {
            container["env"] = serde_json::Value::Array(Vec::new());
        }
        let env = container["env"]
            .as_array_mut()
            .expect("made an array above");
        env.extend((0..count).map(|i| {
            let name = format!("PAD_VAR_{i}");
            if i % 7 == 6 {
                serde_json::json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "pad", "key": format!("k{i}")}}})
            } else {
                serde_json::json!({"name": name, "value": format!("pad-{i}")})
            }
        }));
    }
    Ok(serde_json::to_vec(&review)?)
}

/// The ServiceAccount admission's token volume: this prefix and five characters of its alphabet.
const TOKEN_PREFIX: &[u8] = b"kube-api-access-";
const TOKEN_SUFFIX: usize = 5;
const TOKEN_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Where the five characters after each `kube-api-access-` in `body` are.
fn token_names(body: &[u8]) -> Vec<usize> {
    memchr::memmem::find_iter(body, TOKEN_PREFIX)
        .map(|at| at + TOKEN_PREFIX.len())
        .filter(|&at| {
            body.get(at..at + TOKEN_SUFFIX)
                .is_some_and(|s| s.iter().all(|b| TOKEN_ALPHABET.contains(b)))
        })
        .collect()
}

/// Request `n`'s five characters: `n` in the alphabet's base, another for every `n` below 27^5.
fn token_suffix(n: u64) -> [u8; TOKEN_SUFFIX] {
    let mut out = [0; TOKEN_SUFFIX];
    out.copy_from_slice(&in_alphabet(n, TOKEN_SUFFIX));
    out
}

/// `n` written in the alphabet's base in `len` characters (its lowest digits).
fn in_alphabet(mut n: u64, len: usize) -> Vec<u8> {
    let mut out = vec![TOKEN_ALPHABET[0]; len];
    for slot in out.iter_mut().rev() {
        *slot = TOKEN_ALPHABET[(n % TOKEN_ALPHABET.len() as u64) as usize];
        n /= TOKEN_ALPHABET.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload's pod-template-hash: as long as the body's, another for every workload.
    #[test]
    fn workloads_are_numbered_apart() {
        let hashes: std::collections::HashSet<Vec<u8>> =
            (0..729).map(|n| in_alphabet(n, 2)).collect();
        assert_eq!(hashes.len(), 729);
        assert!(hashes.iter().all(|h| h.len() == 2));
        assert_eq!(in_alphabet(1, 3), b"bbc");
        assert_eq!(&token_suffix(27)[..], b"bbbcb");
    }

    fn pace(rate: f64, total: usize) -> Pace {
        shared_pace(rate, total, 1, total)
    }

    fn shared_pace(rate: f64, total: usize, servers: usize, per_slice: usize) -> Pace {
        let start = Instant::now();
        Pace {
            permits: (0..servers).map(|_| Semaphore::new(0)).collect(),
            next: (0..servers).map(|_| AtomicUsize::new(0)).collect(),
            start,
            interval_ns: 1e9 / rate,
            total,
            per_slice,
            warmup_slots: 0,
            give_up: start + Duration::from_secs(10),
            timeline: false,
        }
    }

    /// With several servers, each one's slots are its turns of the schedule, in order, and
    /// together they are every slot once.
    #[test]
    fn servers_take_the_schedule_in_turns() {
        let (servers, per_slice) = (3, 4);
        let pace = shared_pace(1_000.0, 36, servers, per_slice);
        assert_eq!(pace.each(), 12);
        let mut seen = vec![false; pace.total];
        for server in 0..servers {
            let slots: Vec<usize> = (0..pace.each()).map(|k| pace.slot(server, k)).collect();
            assert!(slots.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
            for &slot in &slots {
                assert_eq!(pace.server_of(slot), server);
                assert!(!seen[slot], "slot {slot} twice");
                seen[slot] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        // Turns of four: 0-3 to the first server, 4-7 to the second, 8-11 to the third, 12 to
        // the first again.
        assert_eq!(pace.slot(1, 0), 4);
        assert_eq!(pace.slot(0, 4), 12);
        assert_eq!(pace.slot(2, 5), 21);
        // One server: the schedule as it is.
        let alone = self::pace(1_000.0, 50);
        assert!((0..alone.each()).all(|k| alone.slot(0, k) == k && alone.server_of(k) == 0));
    }

    #[test]
    fn every_request_names_its_token_volume_anew_everywhere_it_is_written() {
        let body = review_body().unwrap();
        let at = token_names(&body);
        // The volume and a mount in each of the two containers.
        assert_eq!(at.len(), 3);
        assert_eq!(&token_suffix(0), b"bbbbb");
        assert_eq!(&token_suffix(1), b"bbbbc");
        assert_ne!(token_suffix(27 * 27), token_suffix(27 * 27 + 1));
        assert!(token_names(b"kube-api-access-AB").is_empty());
    }

    #[test]
    fn the_slots_due_are_those_whose_time_has_come() {
        // 30,000 a second: intervals of 33,333.3 ns, which floats round both ways.
        let pace = pace(30_000.0, 1_000);
        assert_eq!(pace.due_by(0, pace.start - Duration::from_nanos(1)), 0);
        let mut released = 0;
        for ns in (0..40_000_000u64).step_by(977) {
            let now = pace.start + Duration::from_nanos(ns);
            let due = pace.due_by(released, now);
            assert!(due >= released && due <= pace.total);
            assert!(
                due == 0 || pace.due(due - 1) <= now,
                "slot {} not due at {ns}",
                due - 1
            );
            assert!(
                due == pace.total || pace.due(due) > now,
                "slot {due} due at {ns}"
            );
            released = due;
        }
        assert_eq!(released, 1_000);
        // Slot i is due at start + i/rate: the first at once, the 31st after a millisecond.
        assert_eq!(pace.due_by(0, pace.start), 1);
        assert_eq!(
            pace.due_by(0, pace.start + Duration::from_micros(1_000)),
            31
        );
    }
}
