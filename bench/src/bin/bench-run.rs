//! The driver behind `make bench` (bench/run.sh builds everything and runs criterion first).
//! On 127.0.0.1 only, it starts the transport ceiling (`ceiling`), the release webhook
//! (`sidecar-injector serve`) and the peer (`istio-peer`: Istio's injection webhook, built by
//! bench/istio/build.sh), checks their first answers, drives all three with `loadgen`, measures
//! the webhook's footprint and start-up time, reads the criterion results, prints a table with
//! the goals, and writes `summary.json`.

// The summary is one `json!` object, deeper than the macro's default recursion limit allows.
#![recursion_limit = "256"]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use serde_json::{Value, json};
use sidecar_injector_bench::{
    LOOPBACK, LoadReport, free_port, make_pki, review_body, review_with_env,
};

#[derive(Debug, Parser)]
struct Args {
    /// Output directory: summary.json goes here, scratch files under tmp/.
    #[arg(long)]
    out: PathBuf,
    /// Criterion's output directory (CRITERION_HOME) holding the `engine` bench results.
    #[arg(long)]
    criterion: Option<PathBuf>,
    /// The webhook binary. Default: `sidecar-injector` next to this program.
    #[arg(long)]
    webhook: Option<PathBuf>,
    /// Saturation runs per row, the best kept (other work on the machine only slows runs).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Seconds each server (webhook, ceiling, webhook with its memory on) is measured at 0.4 x
    /// the ceiling's rate for the p99 goal, in one open-loop run whose schedule goes to the
    /// three in turns of `--slice-ms`: all three see the same moments of the machine. Runs one
    /// after another (ABBA, four rounds of 6 s, until this) gave two identical servers p99
    /// ratios up to 5.99 here; turns of a second, 0.75-1.15 (`bench/p99-noise.py`,
    /// docs/benchmarks-history.md). 60 s since 26 November 2026: with 24 the same webhook's ratio
    /// ranged 1.08-2.74 over eight two-server runs, a p99 decided by a few dozen of the machine's
    /// stalls; with 60, 0.92-1.64 over six. (This program's runs at 60 s gave 2.81, 2.26, 14.2 and
    /// 2.97 on HTTP/1.1; the last two at a higher rate, the ceiling measured faster:
    /// docs/benchmarks-history.md, "The goal's rate".)
    #[arg(long, default_value_t = 60.0)]
    latency_seconds: f64,
    /// Length of each server's turn in the latency run, in milliseconds.
    #[arg(long, default_value_t = 1000.0)]
    slice_ms: f64,
    /// Seconds measured per load run.
    #[arg(long, default_value_t = 6.0)]
    duration: f64,
    /// Seconds of load before each measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// HTTP/1.1 connections (one request in flight on each).
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    h2_connections: usize,
    /// HTTP/2 concurrent streams per connection.
    #[arg(long, default_value_t = 8)]
    h2_streams: usize,
    /// Webhook starts timed for start-up to ready (the median is reported).
    #[arg(long, default_value_t = 5)]
    ready_starts: usize,
    /// Which code is measured (bench/run.sh passes the commit), recorded in the summary.
    #[arg(long, default_value = "unknown")]
    revision: String,
    /// Stop everything and fail after this many seconds.
    #[arg(long, default_value_t = 900)]
    budget: u64,
    /// Instruction counts per review (`bench/profile.sh` writes them as JSON); without it
    /// those goals are not measured.
    #[arg(long)]
    instructions: Option<PathBuf>,
    /// The peer: `istio-peer` (bench/istio/build.sh prints its path). Without it the peer rows
    /// are reported as not measured.
    #[arg(long)]
    istio: Option<PathBuf>,
    /// Why there is no peer binary (bench/run.sh passes the build's failure), for the report.
    #[arg(long, conflicts_with = "istio")]
    istio_unavailable: Option<String>,
    /// Env vars in each of the two containers of the large pod sent to the webhook and the peer.
    #[arg(long, default_value_t = 2_000)]
    large_env: usize,
}

/// A server under load: its name in the tables, its port and the path it serves reviews on.
#[derive(Clone, Copy)]
struct Endpoint {
    name: &'static str,
    port: u16,
    path: &'static str,
    /// Load generator flags for this endpoint's runs.
    extra: &'static [&'static str],
}

impl Endpoint {
    /// A server of ours, reviews on `POST /mutate`.
    const fn mutate(name: &'static str, port: u16, extra: &'static [&'static str]) -> Self {
        Self {
            name,
            port,
            path: "/mutate",
            extra,
        }
    }
}

/// A server process of ours; killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("{} exited ({status}):\n{log}", self.name);
        }
        Ok(())
    }
}

/// Open-loop latency of one protocol.
struct Latency {
    proto: Proto,
    /// 0.4 x the ceiling's saturation rate.
    rate: f64,
    hook: LoadReport,
    ceil: LoadReport,
    /// The webhook with its memory of answers on, as deployed.
    memo: LoadReport,
    /// Half the webhook's own saturation rate.
    own_rate: f64,
    own: LoadReport,
}

/// The one-minute load average: how busy the machine was besides us.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The HTTP row of a load run.
#[derive(Clone, Copy)]
enum Proto {
    H1,
    H2,
}

impl Proto {
    fn label(self) -> &'static str {
        match self {
            Self::H1 => "HTTP/1.1",
            Self::H2 => "HTTP/2",
        }
    }
}

struct Bench {
    args: Args,
    started: Instant,
    loadgen: PathBuf,
    ca: PathBuf,
    runs: Vec<Value>,
}

impl Bench {
    fn left(&self) -> anyhow::Result<Duration> {
        let budget = Duration::from_secs(self.args.budget);
        let left = budget.saturating_sub(self.started.elapsed());
        ensure!(!left.is_zero(), "time budget of {budget:?} used up");
        Ok(left)
    }

    fn shape(&self, proto: Proto) -> Vec<String> {
        match proto {
            Proto::H1 => vec![
                "--http".into(),
                "1".into(),
                "--connections".into(),
                self.args.connections.to_string(),
            ],
            Proto::H2 => vec![
                "--http".into(),
                "2".into(),
                "--connections".into(),
                self.args.h2_connections.to_string(),
                "--streams".into(),
                self.args.h2_streams.to_string(),
            ],
        }
    }

    fn shape_label(&self, proto: Proto) -> String {
        match proto {
            Proto::H1 => format!("{} conns", self.args.connections),
            Proto::H2 => format!(
                "{} conns x {} streams",
                self.args.h2_connections, self.args.h2_streams
            ),
        }
    }

    fn loadgen(&mut self, server: Endpoint, extra: &[String]) -> anyhow::Result<String> {
        let lines = self.loadgen_all(&[server], self.args.duration, extra)?;
        Ok(lines.last().cloned().unwrap_or_default())
    }

    /// One load run against `servers` (more than one: they take the schedule in turns, all
    /// on the first one's path and flags); the report lines it printed, one per server.
    fn loadgen_all(
        &mut self,
        servers: &[Endpoint],
        seconds: f64,
        extra: &[String],
    ) -> anyhow::Result<Vec<String>> {
        let limit = Duration::from_secs_f64(self.args.warmup + seconds + 45.0).min(self.left()?);
        let mut cmd = Command::new(&self.loadgen);
        for server in servers {
            cmd.arg("--addr")
                .arg(SocketAddr::new(LOOPBACK, server.port).to_string());
        }
        cmd.arg("--ca")
            .arg(&self.ca)
            .arg("--path")
            .arg(servers[0].path)
            .args(servers[0].extra)
            .args(extra);
        let names: Vec<&str> = servers.iter().map(|s| s.name).collect();
        let output = run_bounded(cmd, limit)?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success(),
            "loadgen against {} failed ({}): {}",
            names.join(", "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout.lines().map(str::to_owned).collect())
    }

    /// The latency goal's run: `servers` in turns of `--slice-ms` at `rate`, each measured for
    /// `--latency-seconds`; each one's report (its percentiles over its own latencies).
    fn load_in_turns(
        &mut self,
        servers: &[Endpoint],
        proto: Proto,
        rate: f64,
    ) -> anyhow::Result<Vec<LoadReport>> {
        let seconds = self.args.latency_seconds * servers.len() as f64;
        let mut extra = self.shape(proto);
        extra.extend([
            "--slice-ms".into(),
            self.args.slice_ms.to_string(),
            "--duration".into(),
            seconds.to_string(),
            "--warmup".into(),
            self.args.warmup.to_string(),
            "--rate".into(),
            format!("{rate:.0}"),
        ]);
        let before = loadavg();
        let lines = self.loadgen_all(servers, seconds, &extra)?;
        ensure!(
            lines.len() >= servers.len(),
            "loadgen printed {} report lines for {} servers",
            lines.len(),
            servers.len()
        );
        let after = loadavg();
        let lines = &lines[lines.len() - servers.len()..];
        servers
            .iter()
            .zip(lines)
            .map(|(server, line)| {
                let turns = Some(self.args.slice_ms);
                self.record(
                    server.name,
                    proto,
                    Some(rate),
                    line,
                    "typical",
                    (before, after),
                    turns,
                )
            })
            .collect()
    }

    fn load(
        &mut self,
        server: Endpoint,
        proto: Proto,
        rate: Option<f64>,
    ) -> anyhow::Result<LoadReport> {
        self.load_body(server, proto, rate, None)
    }

    /// A load run; `body` is an AdmissionReview file to send instead of the typical review.
    fn load_body(
        &mut self,
        server: Endpoint,
        proto: Proto,
        rate: Option<f64>,
        body: Option<&Path>,
    ) -> anyhow::Result<LoadReport> {
        let mut extra = self.shape(proto);
        if let Some(body) = body {
            extra.extend(["--body".into(), body.display().to_string()]);
        }
        extra.extend([
            "--duration".into(),
            self.args.duration.to_string(),
            "--warmup".into(),
            self.args.warmup.to_string(),
        ]);
        if let Some(rate) = rate {
            extra.extend(["--rate".into(), format!("{rate:.0}")]);
        }
        let before = loadavg();
        let line = self.loadgen(server, &extra)?;
        let body = body.map_or("typical", |_| "large_pod");
        self.record(
            server.name,
            proto,
            rate,
            &line,
            body,
            (before, loadavg()),
            None,
        )
    }

    /// A server's report line from a load run: printed, kept for summary.json's `runs` (with
    /// the load average before and after, and the length of the turns if it ran in turns), and
    /// returned.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        server: &str,
        proto: Proto,
        rate: Option<f64>,
        line: &str,
        body: &str,
        (before, after): (f64, f64),
        turns_ms: Option<f64>,
    ) -> anyhow::Result<LoadReport> {
        let report: LoadReport =
            serde_json::from_str(line).with_context(|| format!("loadgen printed {line:?}"))?;
        eprintln!(
            "  {:8} {:8} {:6} {:>7}  {:>9.0} req/s  p50 {:.3} ms  p99 {:.3} ms  errors {}  invalid {}  not sent {}",
            server,
            proto.label(),
            if turns_ms.is_some() {
                "turns"
            } else {
                &report.mode
            },
            rate.map_or(String::new(), |r| format!("@{r:.0}")),
            report.rps,
            report.p50_ms,
            report.p99_ms,
            report.errors,
            report.invalid,
            report.unsent
        );
        let mut value = serde_json::to_value(&report)?;
        value["server"] = server.into();
        value["body"] = body.into();
        if let Some(ms) = turns_ms {
            value["turns_ms"] = ms.into();
        }
        value["loadavg_before"] = before.into();
        value["loadavg_after"] = after.into();
        self.runs.push(value);
        Ok(report)
    }
}

/// The open-loop rate of the latency goal, as a share of the ceiling's saturation rate.
const LATENCY_SHARE: f64 = 0.4;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.rounds >= 1 && args.latency_seconds > 0.0 && args.ready_starts >= 1,
        "at least one run"
    );
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .context("no directory for this program")?;
    let webhook_bin = args
        .webhook
        .clone()
        .unwrap_or_else(|| bin_dir.join("sidecar-injector"));
    let ceiling_bin = bin_dir.join("ceiling");
    for bin in [&webhook_bin, &ceiling_bin, &bin_dir.join("loadgen")] {
        ensure!(bin.is_file(), "{} is not built", bin.display());
    }
    let tmp = args.out.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    let pki = make_pki()?;
    // A directory of their own: the webhook watches its certificate's directory, and the logs
    // and latency files written next to them would be changes for it to look at.
    let tls_dir = tmp.join("tls");
    std::fs::create_dir_all(&tls_dir)?;
    let (ca, cert, key) = (
        tls_dir.join("ca.pem"),
        tls_dir.join("tls.crt"),
        tls_dir.join("tls.key"),
    );
    std::fs::write(&ca, &pki.ca_pem)?;
    std::fs::write(&cert, &pki.cert_pem)?;
    std::fs::write(&key, &pki.key_pem)?;
    let review_bytes = review_body()?.len();

    let mut bench = Bench {
        started: Instant::now(),
        loadgen: bin_dir.join("loadgen"),
        ca: ca.clone(),
        runs: Vec::new(),
        args,
    };

    // 1 + 2: both servers, with the same certificate.
    let ceiling_port = free_port()?;
    let mut ceiling = spawn(
        "ceiling",
        Command::new(&ceiling_bin)
            .arg("--listen")
            .arg(SocketAddr::new(LOOPBACK, ceiling_port).to_string())
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--exit-after")
            .arg(bench.args.budget.to_string()),
        &tmp.join("ceiling.log"),
    )?;
    let (webhook_port, admin_port) = (free_port()?, free_port()?);
    let webhook_start = Instant::now();
    let mut webhook = spawn_webhook(
        &webhook_bin,
        webhook_port,
        admin_port,
        &cert,
        &key,
        &tmp.join("webhook.log"),
        &["--memo-entries", "0"],
    )?;
    let first_ready = wait_ready(&mut webhook, admin_port, webhook_start)?;
    // The webhook judged by the goals runs with its memory of answers off, so that every
    // review is read in full: the bench sends one pod over and over (with a uid and a token
    // volume name of its own each time, as the API server sends a workload's replicas), which
    // the memory answers from the third on. The same webhook as deployed, its memory on, runs
    // beside it in the same turns: what a rollout of one workload costs.
    let (memo_port, memo_admin) = (free_port()?, free_port()?);
    let mut memo = spawn_webhook(
        &webhook_bin,
        memo_port,
        memo_admin,
        &cert,
        &key,
        &tmp.join("webhook-memo-on.log"),
        &[],
    )?;
    wait_ready(&mut memo, memo_admin, Instant::now())?;
    wait_listening(&mut ceiling, ceiling_port, Duration::from_secs(10))?;
    eprintln!(
        "webhook ready in {:.1} ms; checking first answers",
        ms(first_ready)
    );
    let ceiling_ep = Endpoint::mutate("ceiling", ceiling_port, &[]);
    let webhook_ep = Endpoint::mutate("webhook", webhook_port, &[]);
    let memo_ep = Endpoint::mutate("webhook-memo-on", memo_port, &[]);

    // The peer: Istio's injector, with as many Go threads running at once as the webhook's
    // runtime has workers (tokio's default: one per core this process may use).
    let gomaxprocs = std::thread::available_parallelism().map_or(1, usize::from);
    let mut peer = match bench.args.istio.clone() {
        Some(bin) => {
            let port = free_port()?;
            let mut server = spawn_logged(
                "istio",
                Command::new(&bin)
                    .arg("--listen")
                    .arg(SocketAddr::new(LOOPBACK, port).to_string())
                    .arg("--tls-cert-file")
                    .arg(&cert)
                    .arg("--tls-key-file")
                    .arg(&key)
                    .arg("--gomaxprocs")
                    .arg(gomaxprocs.to_string())
                    .arg("--exit-after")
                    .arg(format!("{}s", bench.args.budget)),
                &tmp.join("istio.log"),
            )?;
            // It renders Istio's charts before it listens: allow it more than our own servers.
            let start = Instant::now();
            wait_listening(&mut server, port, Duration::from_secs(60))?;
            eprintln!("istio listening in {:.1} ms", ms(start.elapsed()));
            Some((
                server,
                Endpoint {
                    name: "istio",
                    port,
                    path: "/inject",
                    extra: &[],
                },
            ))
        }
        None => None,
    };
    let peer_ep = peer.as_ref().map(|(_, ep)| *ep);
    let large_body = tmp.join("large-pod.json");
    std::fs::write(
        &large_body,
        review_with_env(&[bench.args.large_env, bench.args.large_env])?,
    )?;
    for ep in [Some(webhook_ep), Some(memo_ep), Some(ceiling_ep), peer_ep]
        .into_iter()
        .flatten()
    {
        for proto in ["1", "2"] {
            let line = bench.loadgen(ep, &["--check".into(), "--http".into(), proto.into()])?;
            eprintln!("  {} HTTP/{proto}: {line}", ep.name);
        }
    }
    // Does each injector answer the large pod with an injection? The peer may refuse it; then
    // its large-pod row says why instead of a number.
    let large_check = |bench: &mut Bench, ep: Endpoint| {
        bench.loadgen(
            ep,
            &[
                "--check".into(),
                "--body".into(),
                large_body.display().to_string(),
            ],
        )
    };
    let line = large_check(&mut bench, webhook_ep)?;
    eprintln!("  webhook, large pod: {line}");
    let peer_large = match peer_ep {
        Some(ep) => match large_check(&mut bench, ep) {
            Ok(line) => {
                eprintln!("  istio, large pod: {line}");
                Ok(ep)
            }
            Err(err) => {
                eprintln!("  istio does not inject the large pod: {err:#}");
                Err(format!("{err:#}"))
            }
        },
        None => Err("no peer".to_owned()),
    };

    let mut servers = vec![(0, ceiling_ep), (1, webhook_ep), (3, memo_ep)];
    if let Some(ep) = peer_ep {
        servers.push((2, ep));
    }
    eprintln!("saturation (closed loop), best of {}:", bench.args.rounds);
    let mut best = [[0.0_f64; 2]; 4]; // [ceiling, webhook, istio, webhook memo off][h1, h2]
    let mut errors = 0;
    for round in 0..bench.args.rounds {
        let mut order: Vec<(usize, Endpoint, Proto)> = [Proto::H1, Proto::H2]
            .into_iter()
            .flat_map(|proto| servers.iter().map(move |&(side, ep)| (side, ep, proto)))
            .collect();
        // ABBA: drift on the machine does not favour one side.
        if round % 2 == 1 {
            order.reverse();
        }
        for (side, ep, proto) in order {
            let report = bench.load(ep, proto, None)?;
            errors += report.errors + report.invalid;
            let p = proto as usize;
            best[side][p] = best[side][p].max(report.rps);
        }
    }

    eprintln!(
        "latency at 0.4 x the ceiling rate ({} s each, one run in turns of {} ms), and at half the webhook's own (open loop):",
        bench.args.latency_seconds, bench.args.slice_ms
    );
    let mut latency = Vec::new();
    for proto in [Proto::H1, Proto::H2] {
        let part = |rps: f64, share: f64| (rps * share).floor().max(1.0);
        let (rate, own_rate) = (
            part(best[0][proto as usize], LATENCY_SHARE),
            part(best[1][proto as usize], 0.5),
        );
        // Webhook, ceiling and the webhook with its memory on take the schedule of one run in
        // turns, so that whatever else the machine does falls on all three alike (separate
        // runs gave it to whichever ran then).
        let [hook, ceil, memo]: [LoadReport; 3] = bench
            .load_in_turns(&[webhook_ep, ceiling_ep, memo_ep], proto, rate)?
            .try_into()
            .map_err(|_| anyhow::anyhow!("not one report for each server"))?;
        let own = bench.load(webhook_ep, proto, Some(own_rate))?;
        errors += hook.errors + ceil.errors + own.errors + memo.errors;
        errors += hook.invalid + ceil.invalid + own.invalid + memo.invalid;
        latency.push(Latency {
            proto,
            rate,
            hook,
            ceil,
            memo,
            own_rate,
            own,
        });
    }

    // 4: footprint. VmHWM is the peak resident set since the process started; the goal's is
    // the larger of the two webhooks' (the memory of answers keeps bodies and answers).
    let rss_mb = vm_hwm_kib(webhook.pid())?.max(vm_hwm_kib(memo.pid())?) as f64 / 1024.0;
    let ceiling_rss_mb = vm_hwm_kib(ceiling.pid())? as f64 / 1024.0;
    // The large pod, webhook and peer (if it injects it) alternating the same way (HTTP/1.1, the
    // same shape). After the footprint is read: 16 large bodies in flight raise a peak RSS that
    // is the typical review's goal.
    let mut large: [Option<LoadReport>; 3] = [None, None, None];
    let mut large_servers = vec![(0, webhook_ep), (2, memo_ep)];
    if let Ok(peer_ep) = &peer_large {
        large_servers.push((1, *peer_ep));
    }
    eprintln!(
        "large pod (2 x {} env), closed loop, best of {}:",
        bench.args.large_env, bench.args.rounds
    );
    for round in 0..bench.args.rounds {
        let mut order = large_servers.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (side, ep) in order {
            let report = bench.load_body(ep, Proto::H1, None, Some(&large_body))?;
            errors += report.errors + report.invalid;
            if large[side].as_ref().is_none_or(|b| report.rps > b.rps) {
                large[side] = Some(report);
            }
        }
    }

    let large_rss_mb = match large[0] {
        Some(_) => Some(vm_hwm_kib(webhook.pid())? as f64 / 1024.0),
        None => None,
    };
    webhook.exited()?;
    ceiling.exited()?;
    memo.exited()?;
    drop(webhook);
    drop(ceiling);
    drop(memo);
    let istio_rss_mb = match &mut peer {
        Some((server, _)) => {
            let rss = vm_hwm_kib(server.pid())? as f64 / 1024.0;
            server.exited()?;
            Some(rss)
        }
        None => None,
    };
    drop(peer);

    let mut ready = Vec::new();
    for _ in 0..bench.args.ready_starts {
        bench.left()?;
        let (port, admin) = (free_port()?, free_port()?);
        let start = Instant::now();
        let mut server = spawn_webhook(
            &webhook_bin,
            port,
            admin,
            &cert,
            &key,
            &tmp.join("webhook-start.log"),
            &[],
        )?;
        ready.push(ms(wait_ready(&mut server, admin, start)?));
    }
    ready.sort_by(f64::total_cmp);
    let ready_ms = ready[ready.len() / 2];

    // 3: the criterion results, if criterion ran.
    let engine = bench
        .args
        .criterion
        .as_deref()
        .map(read_engine)
        .unwrap_or_default();
    let engine_us = |id: &str| {
        engine
            .iter()
            .find(|(name, _)| name == id)
            .map(|(_, ns)| ns / 1e3)
    };
    let large_pod_ms = engine_us("2x2000_env").map(|us| us / 1e3);
    let scaling_ratio = engine_us("env_10000")
        .zip(engine_us("env_1000"))
        .map(|(a, b)| a / b);

    let [ceiling_rps, ceiling_rps_h2] = best[0];
    let [webhook_rps, webhook_rps_h2] = best[1];
    let [memo_rps, memo_rps_h2] = best[3];
    let [istio_rps, istio_rps_h2] = match peer_ep {
        Some(_) => best[2].map(Some),
        None => [None, None],
    };
    let [large_webhook, large_istio, large_memo] = &large;
    let large_ratio = large_webhook
        .as_ref()
        .zip(large_istio.as_ref())
        .map(|(w, i)| w.rps / i.rps);
    let peer_reason = bench
        .args
        .istio_unavailable
        .clone()
        .unwrap_or_else(|| "no --istio given".to_owned());
    let (h1, h2) = (&latency[0], &latency[1]);
    // Instruction counts per review (bench/profile.sh under valgrind), when it ran.
    let instructions: Option<Value> = bench
        .args
        .instructions
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str(&t).ok());
    let count = |key: &str| instructions.as_ref().and_then(|i| i[key].as_f64());
    let scaling_ratio_instructions = count("engine_env_10000")
        .zip(count("engine_env_1000"))
        .map(|(a, b)| a / b);
    let p99_ratio = |l: &Latency| l.hook.p99_ms / l.ceil.p99_ms;
    let goals = vec![
        goal(
            "engine instructions, typical review (render cache hit)",
            count("engine_typical"),
            "<=",
            80_000.0,
            "",
        ),
        goal(
            "engine instructions, typical review of a new ReplicaSet",
            count("engine_typical_distinct"),
            "<=",
            400_000.0,
            "",
        ),
        goal(
            "engine instructions, 2 x 2,000 env pod",
            count("engine_2x2000"),
            "<=",
            2_000_000.0,
            "",
        ),
        goal(
            "webhook >= 0.5 x ceiling, HTTP/1.1",
            Some(webhook_rps / ceiling_rps),
            ">=",
            0.5,
            "",
        ),
        goal(
            "webhook >= 0.5 x ceiling, HTTP/2",
            Some(webhook_rps_h2 / ceiling_rps_h2),
            ">=",
            0.5,
            "",
        ),
        goal(
            "given up at 0.4 x ceiling rate, HTTP/1.1",
            Some(h1.hook.unsent as f64),
            "<=",
            0.0,
            "",
        ),
        goal(
            "given up at 0.4 x ceiling rate, HTTP/2",
            Some(h2.hook.unsent as f64),
            "<=",
            0.0,
            "",
        ),
        goal(
            "p99 / ceiling p99 at 0.4 x ceiling rate, HTTP/1.1",
            Some(p99_ratio(h1)),
            "<=",
            2.0,
            "x",
        ),
        goal(
            "p99 / ceiling p99 at 0.4 x ceiling rate, HTTP/2",
            Some(p99_ratio(h2)),
            "<=",
            2.0,
            "x",
        ),
        goal(
            "large pod (2 x 2,000 env) engine time",
            large_pod_ms,
            "<=",
            1.0,
            " ms",
        ),
        goal(
            "scaling 10,000 / 1,000 env vars",
            scaling_ratio,
            "<=",
            11.0,
            "x",
        ),
        // The same ratio in instructions: what the engine does, whatever else the machine did
        // during criterion's few seconds of each.
        goal(
            "scaling 10,000 / 1,000 env vars, instructions",
            scaling_ratio_instructions,
            "<=",
            11.0,
            "x",
        ),
        goal("peak RSS under load", Some(rss_mb), "<=", 20.0, " MiB"),
        goal(
            "start to /readyz 200 (median)",
            Some(ready_ms),
            "<=",
            50.0,
            " ms",
        ),
    ];

    // The table.
    let machine = machine();
    println!();
    println!(
        "sidecar-injector benchmarks on {} ({} cores; load generator and servers share them)",
        machine["cpu"].as_str().unwrap_or("?"),
        machine["nproc"]
    );
    println!("revision: {}", bench.args.revision);
    println!(
        "review: {review_bytes}-byte AdmissionReview (bench/review.json), POST /mutate over TLS"
    );
    println!(
        "load: that pod with a uid and a service account token volume name of its own on every request, as a real API server sends a workload's replicas (its ServiceAccount admission names each pod's token volume at random); rows \"webhook\": its memory of answers off, every review read in full (what the goals judge); rows \"memory of answers on\": the same webhook as deployed, which answers the replicas from memory from the third on"
    );
    let loads: Vec<f64> = bench
        .runs
        .iter()
        .flat_map(|r| [&r["loadavg_before"], &r["loadavg_after"]])
        .filter_map(Value::as_f64)
        .collect();
    let (low, high) = loads
        .iter()
        .fold((f64::INFINITY, 0.0_f64), |(l, h), x| (l.min(*x), h.max(*x)));
    println!(
        "1-minute load average during the load runs: {low:.2} to {high:.2} (the benchmark's own processes included)"
    );
    match peer_ep {
        Some(_) => println!(
            "peer: istio = Istio's injection webhook ({ISTIO_MODULE} {}, pkg/kube/inject, default template and mesh config), POST /inject, GOMAXPROCS {gomaxprocs}",
            istio_version()
        ),
        None => println!("peer: istio NOT MEASURED: {peer_reason}"),
    }
    println!();
    println!(
        "| server | protocol | shape | req/s (best of {}) | / ceiling | webhook / istio |",
        bench.args.rounds
    );
    println!("|---|---|---|---:|---:|---:|");
    for proto in [Proto::H1, Proto::H2] {
        let p = proto as usize;
        let (c, w) = (best[0][p], best[1][p]);
        let (label, shape) = (proto.label(), bench.shape_label(proto));
        let peer = peer_ep.map(|_| best[2][p]);
        println!("| ceiling | {label} | {shape} | {c:.0} | | |");
        println!(
            "| webhook | {label} | {shape} | {w:.0} | {:.2} | {} |",
            w / c,
            peer.map_or("not measured".into(), |i| format!("{:.2}", w / i))
        );
        println!(
            "| webhook, memory of answers on | {label} | {shape} | {:.0} | {:.2} | |",
            best[3][p],
            best[3][p] / c
        );
        if let Some(i) = peer {
            println!("| istio | {label} | {shape} | {i:.0} | {:.2} | |", i / c);
        }
    }
    println!();
    let large_bytes = std::fs::metadata(&large_body).map_or(0, |m| m.len());
    println!(
        "| large pod (2 x {} env, {large_bytes} bytes), HTTP/1.1, {} | req/s (best of {}) | p50 ms | p99 ms | webhook / istio |",
        bench.args.large_env,
        bench.shape_label(Proto::H1),
        bench.args.rounds
    );
    println!("|---|---:|---:|---:|---:|");
    let memo_large_ratio = large_memo
        .as_ref()
        .zip(large_istio.as_ref())
        .map(|(w, i)| w.rps / i.rps);
    for (name, report) in [
        ("webhook", large_webhook),
        ("webhook, memory of answers on", large_memo),
        ("istio", large_istio),
    ] {
        match report {
            Some(r) => println!(
                "| {name} | {:.0} | {:.3} | {:.3} | {} |",
                r.rps,
                r.p50_ms,
                r.p99_ms,
                match (name, large_ratio, memo_large_ratio) {
                    ("webhook", Some(ratio), _) => format!("{ratio:.2}"),
                    ("webhook, memory of answers on", _, Some(ratio)) => format!("{ratio:.2}"),
                    _ => String::new(),
                }
            ),
            None => println!(
                "| {name} | not measured: {} | | | |",
                match (&peer_ep, &peer_large) {
                    (None, _) => peer_reason.clone(),
                    (Some(_), Err(why)) => format!("istio does not inject it: {why}"),
                    (Some(_), Ok(_)) => "no run".to_owned(),
                }
                .replace('|', "/")
                .replace('\n', " ")
            ),
        }
    }
    println!();
    println!(
        "| server | protocol | offered req/s | achieved req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | not sent |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in &latency {
        for (name, rate, r) in [
            ("webhook (in turns)", l.rate, &l.hook),
            ("ceiling (in turns)", l.rate, &l.ceil),
            ("webhook, memory of answers on (in turns)", l.rate, &l.memo),
            ("webhook, at half its own rate", l.own_rate, &l.own),
        ] {
            println!(
                "| {name} | {} | {rate:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                l.proto.label(),
                r.rps,
                r.p50_ms,
                r.p90_ms,
                r.p99_ms,
                r.p999_ms,
                r.max_ms,
                r.unsent
            );
        }
    }
    println!();
    if engine.is_empty() {
        println!("engine: no criterion results found (run `cargo bench --bench engine` first)");
    } else {
        println!(
            "| engine: review::answer, mutate; typical_memo: through the memory of answers (criterion median) | time |"
        );
        println!("|---|---:|");
        for (name, ns) in &engine {
            println!("| {name} | {:.1} µs |", ns / 1e3);
        }
    }
    println!();
    println!("| footprint | value |");
    println!("|---|---:|");
    println!("| webhooks' peak RSS (VmHWM, the larger) after all load | {rss_mb:.1} MiB |");
    println!("| ceiling peak RSS (VmHWM) after all load | {ceiling_rss_mb:.1} MiB |");
    if let Some(rss) = large_rss_mb {
        println!("| webhook peak RSS (VmHWM) after the large pod too | {rss:.1} MiB |");
    }
    if let Some(rss) = istio_rss_mb {
        println!(
            "| istio peak RSS (VmHWM) after all load, the large pod included | {rss:.1} MiB |"
        );
    }
    println!(
        "| webhook start to /readyz 200, median of {} | {ready_ms:.1} ms (all: {}) |",
        ready.len(),
        ready
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    println!("| goal | measured | target | |");
    println!("|---|---:|---:|---|");
    for g in &goals {
        println!(
            "| {} | {} | {} {}{} | {} |",
            g["goal"].as_str().unwrap_or_default(),
            g["measured"]
                .as_f64()
                .map_or("not measured".into(), |v| format!(
                    "{v:.3}{}",
                    g["unit"].as_str().unwrap_or_default()
                )),
            g["op"].as_str().unwrap_or_default(),
            g["target"],
            g["unit"].as_str().unwrap_or_default(),
            match g["met"].as_bool() {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            }
        );
    }
    if errors > 0 {
        println!(
            "\nWARNING: {errors} requests failed during the load runs; see {}",
            tmp.display()
        );
    }

    let peer_summary = json!({
        "name": "istio",
        "module": ISTIO_MODULE,
        "version": istio_version(),
        "package": "pkg/kube/inject",
        "path": "/inject",
        "gomaxprocs": gomaxprocs,
        "measured": peer_ep.is_some(),
        "unavailable": peer_ep.is_none().then_some(&peer_reason),
        "large_pod": match &peer_large {
            Ok(_) => "injected".to_owned(),
            Err(why) => why.clone(),
        },
        "rss_mb": istio_rss_mb,
    });
    // One row of the p99 goal's turns, both protocols, against the ceiling's p99.
    let latency_rows = |row: fn(&Latency) -> &LoadReport| {
        json!({
            "p50_ms": row(h1).p50_ms,
            "p99_ms": row(h1).p99_ms,
            "p50_ms_h2": row(h2).p50_ms,
            "p99_ms_h2": row(h2).p99_ms,
            "p99_ratio": row(h1).p99_ms / h1.ceil.p99_ms,
            "p99_ratio_h2": row(h2).p99_ms / h2.ceil.p99_ms,
            "given_up": row(h1).unsent,
            "given_up_h2": row(h2).unsent,
        })
    };
    let mut memo_on = latency_rows(|l| &l.memo);
    if let Some(fields) = memo_on.as_object_mut() {
        for (key, value) in [
            ("rps", json!(memo_rps)),
            ("rps_h2", json!(memo_rps_h2)),
            ("rps_ratio", json!(memo_rps / ceiling_rps)),
            ("rps_ratio_h2", json!(memo_rps_h2 / ceiling_rps_h2)),
            ("large_pod_rps", json!(large_memo.as_ref().map(|r| r.rps))),
            (
                "large_pod_p50_ms",
                json!(large_memo.as_ref().map(|r| r.p50_ms)),
            ),
            ("large_pod_istio_ratio", json!(memo_large_ratio)),
        ] {
            fields.insert(key.to_owned(), value);
        }
    }
    let summary = json!({
        "webhook_rps": webhook_rps,
        "ceiling_rps": ceiling_rps,
        "rps_ratio": webhook_rps / ceiling_rps,
        "offered_rps": h1.rate,
        "p50_ms": h1.hook.p50_ms,
        "p99_ms": h1.hook.p99_ms,
        "ceiling_p50_ms": h1.ceil.p50_ms,
        "ceiling_p99_ms": h1.ceil.p99_ms,
        "own_half_rps": h1.own_rate,
        "own_half_p50_ms": h1.own.p50_ms,
        "own_half_p99_ms": h1.own.p99_ms,
        "webhook_rps_h2": webhook_rps_h2,
        "ceiling_rps_h2": ceiling_rps_h2,
        "rps_ratio_h2": webhook_rps_h2 / ceiling_rps_h2,
        "offered_rps_h2": h2.rate,
        "p50_ms_h2": h2.hook.p50_ms,
        "p99_ms_h2": h2.hook.p99_ms,
        "ceiling_p50_ms_h2": h2.ceil.p50_ms,
        "ceiling_p99_ms_h2": h2.ceil.p99_ms,
        "own_half_rps_h2": h2.own_rate,
        "own_half_p50_ms_h2": h2.own.p50_ms,
        "own_half_p99_ms_h2": h2.own.p99_ms,
        "istio_rps": istio_rps,
        "istio_rps_h2": istio_rps_h2,
        "webhook_istio_ratio": istio_rps.map(|i| webhook_rps / i),
        "webhook_istio_ratio_h2": istio_rps_h2.map(|i| webhook_rps_h2 / i),
        "large_pod_webhook_rps": large_webhook.as_ref().map(|r| r.rps),
        "large_pod_istio_rps": large_istio.as_ref().map(|r| r.rps),
        "large_pod_webhook_p50_ms": large_webhook.as_ref().map(|r| r.p50_ms),
        "large_pod_istio_p50_ms": large_istio.as_ref().map(|r| r.p50_ms),
        "large_pod_webhook_istio_ratio": large_ratio,
        "peer": peer_summary,
        "large_pod_ms": large_pod_ms,
        "scaling_ratio": scaling_ratio,
        "scaling_ratio_instructions": scaling_ratio_instructions,
        "engine_us": engine.iter().map(|(n, ns)| (n.clone(), json!(ns / 1e3))).collect::<serde_json::Map<_, _>>(),
        "rss_mb": rss_mb,
        "ceiling_rss_mb": ceiling_rss_mb,
        "large_pod_rss_mb": large_rss_mb,
        "ready_ms": ready_ms,
        "ready_ms_all": ready,
        "first_ready_ms": ms(first_ready),
        "errors": errors,
        "instructions": instructions,
        "p99_ratio": p99_ratio(h1),
        "p99_ratio_h2": p99_ratio(h2),
        "memo_on": memo_on,
        "latency_share": LATENCY_SHARE,
        "goals": goals,
        "machine": machine,
        "revision": bench.args.revision,
        "settings": {
            "review_bytes": review_bytes,
            "rounds": bench.args.rounds,
            "latency_seconds": bench.args.latency_seconds,
            "latency_turns_ms": bench.args.slice_ms,
            "duration_s": bench.args.duration,
            "warmup_s": bench.args.warmup,
            "h1": bench.shape_label(Proto::H1),
            "h2": bench.shape_label(Proto::H2),
            "large_pod_env": [bench.args.large_env, bench.args.large_env],
            "large_pod_bytes": large_bytes,
        },
        "runs": bench.runs,
    });
    let path = bench.args.out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// The peer's module, as bench/istio/go.mod pins it.
const ISTIO_MODULE: &str = "istio.io/istio";
const ISTIO_GO_MOD: &str = include_str!("../../istio/go.mod");

/// The version of `ISTIO_MODULE` the harness is built against.
fn istio_version() -> &'static str {
    ISTIO_GO_MOD
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some(ISTIO_MODULE), Some(version)) => Some(version),
                _ => None,
            }
        })
        .unwrap_or("unknown")
}

fn goal(name: &str, measured: Option<f64>, op: &str, target: f64, unit: &str) -> Value {
    let met = measured.map(|v| if op == ">=" { v >= target } else { v <= target });
    json!({"goal": name, "measured": measured, "op": op, "target": target, "unit": unit, "met": met})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> anyhow::Result<Server> {
    let stderr = std::fs::File::create(log)?;
    cmd.stdout(Stdio::null()).stderr(stderr);
    start(name, cmd, log)
}

/// Like `spawn`, with standard output going to the log too (Istio logs there).
fn spawn_logged(name: &'static str, cmd: &mut Command, log: &Path) -> anyhow::Result<Server> {
    let stderr = std::fs::File::create(log)?;
    cmd.stdout(stderr.try_clone()?).stderr(stderr);
    start(name, cmd, log)
}

fn start(name: &'static str, cmd: &mut Command, log: &Path) -> anyhow::Result<Server> {
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    Ok(Server {
        name,
        child,
        log: log.to_path_buf(),
    })
}

fn spawn_webhook(
    bin: &Path,
    port: u16,
    admin: u16,
    cert: &Path,
    key: &Path,
    log: &Path,
    extra: &[&str],
) -> anyhow::Result<Server> {
    spawn(
        "webhook",
        Command::new(bin)
            .arg("serve")
            .args(extra)
            .arg("--listen")
            .arg(SocketAddr::new(LOOPBACK, port).to_string())
            .arg("--admin-listen")
            .arg(SocketAddr::new(LOOPBACK, admin).to_string())
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .arg("--log-format")
            .arg("json")
            // The production default log level, whatever the caller's shell says.
            .env_remove("RUST_LOG")
            .env_remove("SIDECAR_INJECTOR_CONFIG"),
        log,
    )
}

/// Polls `GET /readyz` every millisecond until it answers 200; the time since `start`.
fn wait_ready(server: &mut Server, admin: u16, start: Instant) -> anyhow::Result<Duration> {
    let addr = SocketAddr::new(LOOPBACK, admin);
    loop {
        if readyz(addr) {
            return Ok(start.elapsed());
        }
        server.exited()?;
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "webhook not ready after 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn readyz(addr: SocketAddr) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        tcp.set_read_timeout(Some(Duration::from_secs(1)))?;
        tcp.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut head = [0_u8; 12];
        tcp.read_exact(&mut head)?;
        Ok(&head == b"HTTP/1.1 200")
    };
    attempt().unwrap_or(false)
}

fn wait_listening(server: &mut Server, port: u16, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    let addr = SocketAddr::new(LOOPBACK, port);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        server.exited()?;
        ensure!(
            start.elapsed() < limit,
            "{} not listening after {limit:?}",
            server.name
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Runs a command to the end, or kills it at `limit`.
fn run_bounded(mut cmd: Command, limit: Duration) -> anyhow::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn vm_hwm_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")
}

/// The engine benches, in order, as (name, median nanoseconds).
fn read_engine(dir: &Path) -> Vec<(String, f64)> {
    let names = [
        "typical",
        "typical_memo",
        "typical_distinct",
        "env_10",
        "env_100",
        "env_1000",
        "env_10000",
        "2x2000_env",
    ];
    names
        .iter()
        .filter_map(|name| {
            let path = dir.join("mutate").join(name).join("new/estimates.json");
            let text = std::fs::read_to_string(path).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            Some((name.to_string(), v["median"]["point_estimate"].as_f64()?))
        })
        .collect()
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, usize::from);
    json!({"cpu": cpu, "nproc": nproc})
}
