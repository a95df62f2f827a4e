#!/usr/bin/env python3
"""How far the p99 goal's method moves on its own: an A/A against the A/B it judges.

`make bench` judges "p99 within 2x the ceiling's at 0.4 x the ceiling's rate" from one open-loop
run whose schedule goes to webhook and ceiling in turns of 1,000 ms (since 26 November 2026;
INTERLEAVE_MS=1000 here: one run per trial, ROUNDS x 6 s measured a side). Without
INTERLEAVE_MS, the method until then: ROUNDS open-loop runs per side, taken in turns (ABBA...)
and pooled. This runs that method TRIALS times with
two ceilings (`aa`: the same binary on both sides, so every ratio away from 1 is the method's
own noise), with the webhook against a ceiling (`ab`), or with a ceiling that also runs the
engine on each body against a plain one (`eb`: the engine's share of the webhook's gap, without
the webhook's shell), or with a ceiling that spins SPIN_US microseconds a request against a
plain one (`sb`: a synthetic engine of known cost that fetches nothing), and prints each
trial's pooled p99s and their ratio, one JSON line each. Loopback only; bounded: TRIALS x 2 x ROUNDS runs of 7 s
(a ladder: that for each of its 2 + len(SPINS) rungs).

    python3 bench/p99-noise.py aa|ab|eb|sb HTTP RATE TRIALS [ROUNDS]      (e.g. ab 2 17000 5 4; ROUNDS: 2)
    python3 bench/p99-noise.py ladder HTTP RATE TRIALS ROUNDS SPINS       (e.g. ladder 1 27000 3 10 2,4,6)

`goal` repeats the goal's own judgement as `make bench` makes it, TRIALS times, each trial with
servers of its own: the ceiling's closed-loop rate (best of two runs of 6 s), then one open-loop
run at 0.4 of it in turns of 1,000 ms, 60 s a server, of the webhook (its memory of answers off),
the ceiling and the webhook with its memory on. Each trial's line gives the rate and the three
p99s; the last line, the ratios and how many went over 2x. Each trial takes about 3.5 minutes.
WEBHOOK_ARGS is not used here (the two webhooks are `make bench`'s).

    python3 bench/p99-noise.py goal HTTP TRIALS                             (e.g. goal 1 6)

`ladder` runs, in each trial, aa, then sb with each spin of SPINS (µs, comma-separated), then ab,
one after another, so that every rung sees the same phases of the machine; after the runs' lines
it prints a line per rung: its ratios, how many went over 2x, and the server CPU a request each
side differed by. Each trial of any pair starts servers of its own (until 26 November 2026 the
servers of a pair served all its trials).

Uses the release binaries of `make bench` (CARGO_TARGET_DIR or target/release).

Each trial's line also gives both sides' pooled p50, each run's p99, and for each run the
server's CPU per request sent (user + system, all threads, warm-up included) and its threads' context switches
per request.

PIN=SERVERS:LOADGEN (CPU lists, e.g. PIN=1:0) runs the servers on the first CPUs and the load
generator on the second, as the API server runs on other machines than a webhook in a cluster;
unset, all share every CPU as in `make bench`. LOADGEN_FIFO=N runs the load generator under
SCHED_FIFO priority N (root), so that it never waits behind the server it measures.
LOADGEN_ARGS adds flags to every load run (e.g. LOADGEN_ARGS=--fixed-token: replicas that mount no
service account token). WEBHOOK_ARGS adds flags to the webhook's command line (e.g. WEBHOOK_ARGS="--memo-entries 0":
every review read in full, as for pods that never repeat). TOKIO_WORKER_THREADS=N gives both servers N serving threads (`server::cores`; default: one per
CPU they may run on).
ENGINE_RUNS=N (`eb` only) has the engine ceiling review each body N times a request: the runs
after the first find what the first brought into the caches, so the server CPU a request of
ENGINE_RUNS=1, 2 and 3 against the plain ceiling's tells a cold review from a warm one.
"""

import array
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")


def pinned(part):
    """A preexec_fn pinning the child to PIN's part (0: servers, 1: load generator), or None
    when PIN is unset."""
    pin = os.environ.get("PIN")
    if not pin:
        return None
    chosen = {int(c) for c in pin.split(":")[part].split(",")}
    return lambda: os.sched_setaffinity(0, chosen)


def start(kind, port, tmp, spin_us=None, webhook_args=None):
    """A server of `kind` on `port`; a webhook gets `webhook_args` (WEBHOOK_ARGS when None)."""
    ca = os.path.join(tmp, f"{kind}-{port}-ca.pem")
    if kind == "webhook":
        if webhook_args is None:
            webhook_args = os.environ.get("WEBHOOK_ARGS", "")
        cmd = [f"{BIN}/sidecar-injector", "serve", "--listen", f"127.0.0.1:{port}",
               "--admin-listen", f"127.0.0.1:{port + 1}", "--dev-ca-file", ca, "--log-format", "json"] \
            + webhook_args.split()
        # Errors only. make bench runs the production default (info; it removes RUST_LOG), but an
        # injected review logs at debug, so neither level writes a line a request.
        env = {**os.environ, "RUST_LOG": ""}
    else:
        cmd = [f"{BIN}/ceiling", "--listen", f"127.0.0.1:{port}", "--dev-ca-file", ca,
               "--exit-after", "3600"] \
            + (["--engine", "--engine-runs", os.environ.get("ENGINE_RUNS", "1")] if kind == "engine" else []) \
            + (["--spin-us", str(spin_us if spin_us is not None else os.environ.get("SPIN_US", "8"))] if kind == "spin" else [])
        env = os.environ
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, preexec_fn=pinned(0))
    for _ in range(200):
        if os.path.exists(ca) and os.path.getsize(ca) > 0:
            break
        if proc.poll() is not None:
            sys.exit(f"{kind} exited at start: {proc.returncode}")
        time.sleep(0.05)
    else:
        sys.exit(f"{kind} wrote no CA in 10 s")
    time.sleep(0.2)
    return proc, port, ca


def cpu_and_switches(pid):
    """The process's CPU seconds (user + system, all threads) and its threads' context switches
    so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    switches = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                switches += sum(int(line.split()[-1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:
            pass
    return cpu, switches


def loadgen_preexec():
    """PIN's load-generator part, and with LOADGEN_FIFO=N the load generator under SCHED_FIFO
    priority N: it then runs as soon as it wakes, as an API server on its own machine would,
    instead of waiting behind the server it measures on the two shared cores."""
    pin = pinned(1)
    fifo = int(os.environ.get("LOADGEN_FIFO", "0"))
    if not pin and not fifo:
        return None

    def apply():
        if pin:
            pin()
        if fifo:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fifo))
    return apply


def shape(http):
    """`make bench`'s connections for `http`: 16 on HTTP/1.1, 2 of 8 streams each on HTTP/2."""
    return ["--connections", "16"] if http == 1 else ["--connections", "2", "--streams", "8"]


def addresses(servers):
    """loadgen's `--addr` and `--ca` for each server, in turn order."""
    return [a for _, port, ca in servers for a in ("--addr", f"127.0.0.1:{port}", "--ca", ca)]


def loadgen(http, args, timeout=None):
    """One loadgen run in the shape of `http`, with `args`; its report lines (JSON)."""
    out = subprocess.run(
        [f"{BIN}/loadgen", "--http", str(http), *shape(http), *args],
        capture_output=True, text=True, check=True, preexec_fn=loadgen_preexec(),
        timeout=timeout).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


# Seconds of each open-loop run: warm-up, then measured.
WARMUP, DURATION = 1, 6


def run(server, http, rate, path):
    proc, port, ca = server
    cpu0, switches0 = cpu_and_switches(proc.pid)
    report = loadgen(http, [
        "--addr", f"127.0.0.1:{port}", "--ca", ca, *os.environ.get("LOADGEN_ARGS", "").split(),
        "--rate", str(rate), "--duration", str(DURATION), "--warmup", str(WARMUP),
        "--latencies", path])[-1]
    cpu1, switches1 = cpu_and_switches(proc.pid)
    # Per request sent, warm-up included.
    sent = rate * (WARMUP + DURATION)
    report["server_cpu_us"] = (cpu1 - cpu0) / sent * 1e6
    report["server_switches"] = (switches1 - switches0) / sent
    latencies = array.array("Q")
    with open(path, "rb") as f:
        latencies.frombytes(f.read())
    return report, latencies


def run_interleaved(servers, http, rate, rounds, tmp, slice_ms):
    """One load run against both servers, the schedule cut into turns of `slice_ms` that go to
    them in turn (loadgen with two --addr), each measured for ROUNDS x DURATION seconds: both
    sides see the same moments of the machine."""
    paths = [os.path.join(tmp, f"l{side}.bin") for side in (0, 1)]
    before = [cpu_and_switches(proc.pid) for proc, _, _ in servers]
    reports = loadgen(http, [
        *addresses(servers), *[a for path in paths for a in ("--latencies", path)],
        "--slice-ms", str(slice_ms), *os.environ.get("LOADGEN_ARGS", "").split(),
        "--rate", str(rate), "--duration", str(2 * rounds * DURATION), "--warmup", str(WARMUP)])[-2:]
    # Requests each server was sent: loadgen rounds the warm-up and the measured time up to
    # whole rounds of turns (a turn each), and gives each server half.
    per_round = 2 * max(1, round(rate * slice_ms / 1e3))
    whole = lambda seconds: -(-round(rate * seconds) // per_round) * per_round
    sent = (whole(WARMUP) + whole(2 * rounds * DURATION)) / 2
    result = []
    for side, (proc, _, _) in enumerate(servers):
        cpu1, switches1 = cpu_and_switches(proc.pid)
        cpu0, switches0 = before[side]
        reports[side]["server_cpu_us"] = (cpu1 - cpu0) / sent * 1e6
        reports[side]["server_switches"] = (switches1 - switches0) / sent
        latencies = array.array("Q")
        with open(paths[side], "rb") as f:
            latencies.frombytes(f.read())
        result.append((reports[side], latencies))
    return result


def percentiles_ms(samples, *qs):
    s = sorted(samples)
    return [s[int(len(s) * q)] / 1e6 for q in qs]


# The first side of each pair; the second is always the ceiling.
PAIRS = {"aa": "ceiling", "ab": "webhook", "eb": "engine", "sb": "spin"}


def trial(pair, http, rate, rounds, trial_no, spin_us=None):
    """One trial of `pair` with servers of its own (`spin_us`: the spinning ceiling's spin, else
    SPIN_US): its JSON line (a dict)."""
    pooled = [array.array("Q"), array.array("Q")]
    given_up = [0, 0]
    cpu, switches, run_p99 = [[], []], [[], []], [[], []]

    def record(side, report, latencies):
        pooled[side].extend(latencies)
        given_up[side] += report["unsent"] + report["errors"]
        cpu[side].append(round(report["server_cpu_us"], 1))
        switches[side].append(round(report["server_switches"], 2))
        run_p99[side].append(round(percentiles_ms(latencies, 0.99)[0], 3))

    with tempfile.TemporaryDirectory() as tmp:
        servers = []
        try:
            servers.append(start(PAIRS[pair], 19500, tmp, spin_us))
            servers.append(start("ceiling", 19510, tmp))
            slice_ms = float(os.environ.get("INTERLEAVE_MS", "0"))
            if slice_ms:
                for side, (report, latencies) in enumerate(
                        run_interleaved(servers, http, rate, rounds, tmp, slice_ms)):
                    record(side, report, latencies)
            for rnd in range(0 if slice_ms else rounds):
                for side in ([0, 1] if rnd % 2 == 0 else [1, 0]):
                    record(side, *run(servers[side], http, rate, os.path.join(tmp, "l.bin")))
        finally:
            for proc, _, _ in servers:
                proc.terminate()
                proc.wait()
    (a, a50), (b, b50) = (percentiles_ms(side, 0.99, 0.5) for side in pooled)
    return {"pair": pair, "http": http, "rate": rate, "rounds": rounds, "trial": trial_no,
            **({"spin_us": spin_us} if spin_us is not None else {}),
            "p99_a_ms": round(a, 3), "p99_b_ms": round(b, 3),
            "ratio": round(a / b, 2), "given_up": given_up,
            "p50_a_ms": round(a50, 3), "p50_b_ms": round(b50, 3),
            "server_cpu_us_a": cpu[0], "server_cpu_us_b": cpu[1],
            "switches_a": switches[0], "switches_b": switches[1],
            "run_p99_a_ms": run_p99[0], "run_p99_b_ms": run_p99[1]}


def ladder(http, rate, trials, rounds, spins):
    """Each trial: two ceilings (aa), a ceiling spinning each of `spins` µs a request against a
    plain one (sb), and the webhook against a ceiling (ab), one after another with servers of
    their own, so that every rung sees the same phases of the machine. Prints each run's line,
    then each rung's ratios and the extra server CPU a request they came from."""
    rungs = [("aa", None)] + [("sb", spin) for spin in spins] + [("ab", None)]
    results = {rung: [] for rung in rungs}
    for trial_no in range(trials):
        for pair, spin in rungs:
            line = trial(pair, http, rate, rounds, trial_no, spin)
            print(json.dumps(line), flush=True)
            results[(pair, spin)].append(line)
    for (pair, spin), lines in results.items():
        name = f"sb {spin} us" if spin is not None else pair
        extra = [round(sum(l["server_cpu_us_a"]) / len(l["server_cpu_us_a"])
                       - sum(l["server_cpu_us_b"]) / len(l["server_cpu_us_b"]), 1) for l in lines]
        print(json.dumps({"rung": name, "ratios": [l["ratio"] for l in lines],
                          "over_2x": sum(l["ratio"] > 2 for l in lines),
                          "extra_cpu_us": extra,
                          "ceiling_p99_ms": [l["p99_b_ms"] for l in lines]}), flush=True)


# `make bench`'s latency goal: its share of the ceiling's rate, seconds a server, turn length.
GOAL_SHARE, GOAL_SECONDS, GOAL_TURN_MS = 0.4, 60, 1000


def goal(http, trials):
    """`make bench`'s p99 goal, judged TRIALS times, each at 0.4 of the ceiling's closed-loop
    rate measured just before it (see the module's doc)."""
    ratios = []
    for trial_no in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            servers = []
            try:
                servers.append(start("webhook", 19500, tmp, webhook_args="--memo-entries 0"))
                servers.append(start("ceiling", 19510, tmp))
                servers.append(start("webhook", 19520, tmp, webhook_args=""))
                bound = 4 * GOAL_SECONDS + 60
                closed = [loadgen(http, [*addresses(servers[1:2]), "--duration", str(DURATION),
                                         "--warmup", str(WARMUP)], bound)[-1]["rps"]
                          for _ in range(2)]
                rate = round(GOAL_SHARE * max(closed))
                load = [os.getloadavg()[0]]
                reports = loadgen(http, [
                    *addresses(servers), "--slice-ms", str(GOAL_TURN_MS),
                    "--duration", str(GOAL_SECONDS * len(servers)), "--warmup", str(WARMUP),
                    "--rate", str(rate)], bound)[-len(servers):]
                load.append(os.getloadavg()[0])
            finally:
                for proc, _, _ in servers:
                    proc.terminate()
                    proc.wait()
        webhook, ceiling, memo = reports
        ratio = round(webhook["p99_ms"] / ceiling["p99_ms"], 2)
        ratios.append(ratio)
        print(json.dumps({"goal": trial_no, "http": http, "ceiling_rps": [round(r) for r in closed],
                          "rate": rate, "p99_webhook_ms": round(webhook["p99_ms"], 3),
                          "p99_ceiling_ms": round(ceiling["p99_ms"], 3),
                          "p99_memo_ms": round(memo["p99_ms"], 3), "ratio": ratio,
                          "given_up": [r["unsent"] for r in reports],
                          "failed": [r["errors"] + r["invalid"] for r in reports],
                          "load": [round(x, 2) for x in load]}), flush=True)
    print(json.dumps({"goal": "summary", "http": http, "ratios": ratios,
                      "over_2x": sum(r > 2 for r in ratios)}), flush=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "goal":
        goal(int(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "ladder":
        if len(sys.argv) != 7:
            sys.exit(__doc__)
        http, rate, trials, rounds = (int(a) for a in sys.argv[2:6])
        ladder(http, rate, trials, rounds, [int(s) for s in sys.argv[6].split(",")])
        return
    if len(sys.argv) not in (5, 6) or sys.argv[1] not in PAIRS:
        sys.exit(__doc__)
    pair, http, rate, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rounds = int(sys.argv[5]) if len(sys.argv) == 6 else 2
    for trial_no in range(trials):
        print(json.dumps(trial(pair, http, rate, rounds, trial_no)), flush=True)


if __name__ == "__main__":
    main()
