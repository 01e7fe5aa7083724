#!/usr/bin/env python3
"""Redis under probes: requests per second with no probe, kernel uprobes and urewrite.

    python3 samples/redis_bench.py [--requests N] [--repeat R] [--clients C] [--no-kernel] [--json]

Copies Debian's redis-server (apt-get install redis-server redis-tools), rewrites
the copy with entry probes on readQueryFromClient, processCommand and call, and
runs `redis-benchmark -h 127.0.0.1 -p PORT -q -n N -t set,get` against a server
on 127.0.0.1 and a free port (started with --save '' --appendonly no, stopped
with SIGTERM by its PID however the run ends):
- no probe: the copy as is;
- kernel uprobes: the copy, with uprobe events on the three functions through
  tracefs (root only; counts from uprobe_profile; the events are removed after);
- urewrite: the rewritten copy under `urewrite stat` (counts from its report).
Rounds are interleaved; the median RPS of each is shown, with the probe counts
of both tools, which must agree. `urewrite bench --redis` runs the same code
(urewrite.bench.redis.redis_bench).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from urewrite import bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000,
                        help="requests per redis-benchmark test (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--clients", type=int, default=50, help="parallel clients (default 50)")
    parser.add_argument("--no-kernel", action="store_true",
                        help="skip the kernel uprobe configuration")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.requests < 1 or args.repeat < 1 or args.clients < 1:
        parser.error("--requests, --repeat and --clients must be at least 1")
    try:
        with tempfile.TemporaryDirectory(prefix="urewrite-redis-") as work:
            result = bench.redis_bench(work, args.requests, args.repeat, not args.no_kernel,
                                       args.clients)
    except bench.BenchError as e:
        print(f"redis_bench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("redis_bench: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(bench.format_redis_table(result))
    if result.get("skipped"):
        return 0
    return 0 if result["counts_agree"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
