#!/usr/bin/env python3
"""Where an open-loop run's tail came from: `loadgen --timeline FILE` in 10-ms windows of the
schedule.

    python3 bench/timeline.py FILE RATE [MS]      (MS: the threshold a window is shown at, 2)

Prints the run's p50 and p99, then each window whose slowest request took MS or more: how many
requests were due in it, the slowest one's latency, and the largest send lag among them (how
long after it was due a request was sent). A latency that is mostly send lag waited in the load generator for a free
connection (every one held by a request the server had not answered); a tail that climbs
window after window is a backlog the server drained slower than requests came, not one stall.

Before the windows it prints what tells a tail of stalls from a tail of single slow requests:
the share of requests over 0.5 and 1 ms, and the p99 again without the requests of the 5, 20
and 60 windows whose slowest request was slowest. A p99 that falls to near the p50 without a
few windows came from stalls; one that stays came from requests slow one by one all through
the run (docs/benchmarks-history.md, "At 85e782b").
"""

import array
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    path, rate = sys.argv[1], float(sys.argv[2])
    threshold_ns = float(sys.argv[3] if len(sys.argv) == 4 else 2) * 1e6
    values = array.array("Q")
    with open(path, "rb") as f:
        values.frombytes(f.read())
    if len(values) % 3 or not values:
        sys.exit(f"{path}: not a loadgen --timeline file")
    rows = [values[i:i + 3] for i in range(0, len(values), 3)]
    latencies = sorted(row[2] for row in rows)
    print(f"requests {len(rows)}  p50 {latencies[len(latencies) // 2] / 1e6:.3f} ms  "
          f"p99 {latencies[int(len(latencies) * 0.99)] / 1e6:.3f} ms")
    windows = {}
    by_window = {}
    for slot, lag, latency in rows:
        k = int(slot / rate * 100)
        by_window.setdefault(k, []).append(latency)
        window = windows.setdefault(k, [0, 0, 0])
        window[0] += 1
        window[1] = max(window[1], latency)
        window[2] = max(window[2], lag)
    over = [sum(1 for v in latencies if v > limit) / len(latencies) * 100 for limit in (5e5, 1e6)]
    print(f"over 0.5 ms {over[0]:.2f}%  over 1 ms {over[1]:.2f}%")
    worst = sorted(by_window, key=lambda k: -windows[k][1])
    for drop in (5, 20, 60):
        left = set(worst[:drop])
        kept = sorted(v for k, vs in by_window.items() if k not in left for v in vs)
        if kept:
            print(f"p99 without the {drop} slowest windows {kept[int(len(kept) * 0.99)] / 1e6:.3f} ms")
    slow = [(k, w) for k, w in sorted(windows.items()) if w[1] >= threshold_ns]
    print(f"windows of 10 ms at or over {threshold_ns / 1e6:g} ms: {len(slow)} of {len(windows)}")
    for k, (count, latency, lag) in slow:
        print(f"  {k * 10:6d} ms  due {count:5d}  slowest {latency / 1e6:8.2f} ms  "
              f"largest send lag {lag / 1e6:8.2f} ms")


if __name__ == "__main__":
    main()
