"""PostgreSQL (--postgres): Debian's PostgreSQL 15 under pgbench, as people run it (started
by pg_ctl as the postgres user), with its 71 USDT probe sites of provider `postgresql`:

    original          the server as installed (a copy of its file), no probe
    urewrite stat     the server rewritten with every USDT probe, armed, counting
    urewrite run      the same rewrite, with a program keyed by probe:
                      usdt:...:postgresql:* { @[probe] = count(); }
    bpftrace          the same program on the original, with kernel uprobes

Each configuration runs side by side with a reference server ("duet" benchmarking), at
the same time, on the same machine: a copy of the original binary (a file of its own:
bpftrace's uprobes are on another copy, the one tested), its own cluster, its own
pgbench with as many clients. A round's figure is the configuration's transactions per
second over the reference's of that same run. On a shared machine a run's TPS moves by
10% and more from one run to the next (the host's other guests), and both servers move
with it; their ratio moves by about 1% (run one after the other, rounds of the same two
binaries spread 0.78 to 1.29 here; side by side, 0.94 to 1.09, most within 1%).
"original" beside the reference is that spread itself: the method's own noise. The ratio
reported is the median of the rounds'; which cluster each side runs in, which side
starts first and the order of the configurations turn from round to round. Also, around
each pgbench run, the CPU time each server used a transaction (the postmaster's own and
its reaped backends', from /proc).
Throwaway clusters in a temporary directory, on Unix sockets only; never Debian's own
service. Root only: the servers run as the postgres user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env, log

BIN = "/usr/lib/postgresql/15/bin"
USER = "postgres"
PROGRAM = "usdt:{path}:postgresql:* {{ @[probe] = count(); }}"
CONFIGS = ("original", "urewrite stat", "urewrite run", "bpftrace")
SIDES = {"left": 5498, "right": 5499}  # a cluster's directory and its port

# One side of a round, as the postgres user: start the server BINARY on a socket in DIR,
# fill the tables (pgbench -i; as many branches as clients, as pgbench's manual asks,
# so that the clients do not all queue on one row), say ready, wait for GO, run pgbench
# for SECONDS with CLIENTS clients, stop. Around the pgbench run, the CPU time (clock
# ticks) the server's processes have used: the postmaster's own and its reaped
# children's, and its live children's (the backends exit when pgbench's connections
# close; a moment later the postmaster has reaped them).
WORKLOAD = """set -e
binary=$1 dir=$2 port=$3 seconds=$4 clients=$5 go=$6
conn="-h $dir/socket -p $port -U postgres"
{bin}/pg_ctl -D "$dir/data" -p "$binary" -l "$dir/server.log" \\
    -o "-k $dir/socket -p $port -c listen_addresses= -c autovacuum=off -c fsync=off -c jit=off" \\
    -w start > /dev/null
trap '{bin}/pg_ctl -D "$dir/data" -m fast -w stop > /dev/null' EXIT
{bin}/pgbench $conn -i -q -s "$clients" postgres > /dev/null 2>&1
cpu() {{
    pm=$(head -n 1 "$dir/data/postmaster.pid")
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pm="$pm" \\
        '$1 == pm {{ t += $14 + $15 + $16 + $17 }} $4 == pm {{ t += $14 + $15 }} END {{ print t }}'
}}
sleep 0.5
touch "$dir/ready"
while [ ! -e "$go" ]; do sleep 0.01; done
echo "server cpu before: $(cpu)"
{bin}/pgbench $conn -n -c "$clients" -j "$clients" -T "$seconds" postgres
sleep 0.5
echo "server cpu after: $(cpu)"
"""


def postgres_unavailable() -> Optional[str]:
    if not os.path.exists(os.path.join(BIN, "postgres")):
        return "Debian's postgresql-15 is not installed (apt-get install postgresql-15)"
    if os.geteuid() != 0:
        return "the server runs as the postgres user: needs root"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER} user (Debian's postgresql-15 makes it)"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    return None


def postgres_bench(seconds: int = 10, repeat: int = 3, clients: int = 2,
                   kernel: bool = True) -> dict:
    """`clients`: pgbench's clients on each side (the two servers' backends and
    pgbench's threads then share the machine)."""
    why = postgres_unavailable()
    if why:
        return {"skipped": why}
    bpftrace = shutil.which("bpftrace") if kernel else None
    root = tempfile.mkdtemp(prefix="urewrite-bench-pg-")
    try:
        return _bench(root, seconds, repeat, clients, bpftrace, kernel)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench(root: str, seconds: int, repeat: int, clients: int, bpftrace: Optional[str],
           kernel: bool) -> dict:
    entry = pwd.getpwnam(USER)
    original = os.path.join(BIN, "postgres")
    # the reference and the unprobed server tested beside it: two copies of the original
    # in one directory, as the rewrite is (bpftrace's uprobes on the tested copy only)
    reference, plain = (os.path.join(root, f"postgres.{name}") for name in ("reference",
                                                                            "original"))
    for path in (reference, plain):
        shutil.copy2(original, path)
    probed = os.path.join(root, "postgres.probed")
    proc = subprocess.run([sys.executable, "-m", "urewrite", original, "-p", "usdt:postgresql:*",
                           "-q", "-o", probed], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot rewrite postgres: {proc.stderr.strip()}")
    script = os.path.join(root, "workload.sh")
    with open(script, "w") as f:
        f.write(WORKLOAD.format(bin=BIN))
    owned = [root, probed, reference, plain, script]
    for side in SIDES:
        owned += [os.path.join(root, side), os.path.join(root, side, "socket")]
        os.mkdir(owned[-2], 0o700)
        os.mkdir(owned[-1], 0o700)
    for path in owned:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(root, 0o755)
    for path in (probed, reference, plain):
        os.chmod(path, 0o755)
    for side in SIDES:
        _as_postgres([os.path.join(BIN, "initdb"), "-D", os.path.join(root, side, "data"),
                      "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8", "--locale", "C"],
                     root)
    version = subprocess.run([original, "--version"], capture_output=True,
                             text=True).stdout.strip()
    skipped = None if bpftrace else ("--no-kernel" if not kernel else "bpftrace not installed")
    binaries = {"original": plain, "reference": reference, "probed": probed}
    configs = [c for c in CONFIGS if c != "bpftrace" or bpftrace]
    tps: Dict[str, List[float]] = {c: [] for c in configs}
    beside: Dict[str, List[float]] = {c: [] for c in configs}  # the reference's, same runs
    cpu: Dict[str, List[float]] = {c: [] for c in configs}
    cpu_beside: Dict[str, List[float]] = {c: [] for c in configs}
    counts: Dict[str, Dict[str, int]] = {}
    for r in range(repeat):
        # (reference, tested): which cluster each runs in, and which starts first, turn
        sides = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for config in configs[r % len(configs):] + configs[:r % len(configs)]:
            log(f"postgres: round {r + 1}/{repeat}, {config} beside the original")
            tested, reference_run, hits = _one_round(config, root, binaries, script, sides,
                                                     r % 4 >= 2, seconds, clients, bpftrace)
            tps[config].append(tested[0])
            cpu[config].append(tested[1])
            beside[config].append(reference_run[0])
            cpu_beside[config].append(reference_run[1])
            if hits is not None:
                counts[config] = hits
    ratios = {c: [a / b for a, b in zip(tps[c], beside[c])] for c in configs}
    # the server's CPU time a transaction: the reference's over the tested one's
    cpu_ratios = {c: [b / a for a, b in zip(cpu[c], cpu_beside[c])] for c in configs}
    return {"version": version, "seconds": seconds, "clients": clients, "repeat": repeat,
            "method": "side by side", "sites": _site_count(counts), "tps": tps,
            "median_tps": {c: statistics.median(v) for c, v in tps.items()},
            "reference_tps": beside,
            "median_reference_tps": {c: statistics.median(v) for c, v in beside.items()},
            "ratio": {c: statistics.median(v) for c, v in ratios.items()},
            "round_ratios": ratios, "cpu_us_per_transaction": cpu,
            "median_cpu_us": {c: statistics.median(v) for c, v in cpu.items()},
            "cpu_ratio": {c: statistics.median(v) for c, v in cpu_ratios.items()},
            "round_cpu_ratios": cpu_ratios,
            "transactions_counted": {c: h.get("postgresql:transaction__start", 0)
                                     for c, h in counts.items()},
            "kernel_skipped": skipped}


def _one_round(config: str, root: str, binaries: Dict[str, str], script: str,
               sides: List[str], tested_first: bool, seconds: int, clients: int,
               bpftrace: Optional[str]) -> tuple:
    """One pgbench run of `config` on sides[1] beside the reference on sides[0], started
    together once both have their tables: ((tps, CPU us a transaction) of the tested
    server, the same of the reference, hits by probe name or None)."""
    go = os.path.join(root, "go")
    for path in [go] + [os.path.join(root, side, "ready") for side in SIDES]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def workload(binary: str, side: str) -> List[str]:
        return ["runuser", "-u", USER, "--", "sh", script, binary, os.path.join(root, side),
                str(SIDES[side]), str(seconds), str(clients), go]

    report = os.path.join(root, "report.out")
    probed = binaries["probed"]
    if config == "urewrite stat":
        command = [sys.executable, "-m", "urewrite", "stat", "--json", "-o", report, "--"]
    elif config == "urewrite run":
        # (the rewrite by its name in the directory, as `probe` names it: a string)
        command = [sys.executable, "-m", "urewrite", "run", "--json", "-e",
                   PROGRAM.format(path=os.path.basename(probed)), "-o", report, "--"]
    else:
        command = []
    binary = probed if config.startswith("urewrite") else binaries["original"]
    # bpftrace attaches to the file for every process (with -c, it looks for the probes
    # in the command's own process: runuser has none); the reference is another file
    tracer = _bpftrace(bpftrace, binaries["original"], report) if config == "bpftrace" \
        else None
    commands = [workload(binaries["reference"], sides[0]), command + workload(binary, sides[1])]
    runs: List[subprocess.Popen] = []
    try:
        for started in (commands[::-1] if tested_first else commands):
            runs.append(subprocess.Popen(started, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, cwd=root,
                                         env=clean_env()))
        if tested_first:
            runs.reverse()  # (runs[0]: the reference's)
        deadline = time.monotonic() + RUN_TIMEOUT
        while not all(os.path.exists(os.path.join(root, side, "ready")) for side in sides):
            if time.monotonic() > deadline or any(run.poll() is not None for run in runs):
                break
            time.sleep(0.02)
        open(go, "w").close()
        outputs = [run.communicate(timeout=RUN_TIMEOUT + seconds) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
        if tracer is not None:
            _stop(tracer)
    figures = [_figures(config if k else "the reference", run.returncode, *output)
               for k, (run, output) in enumerate(zip(runs, outputs))]
    return figures[1], figures[0], _hits(config, report)


def _figures(who: str, returncode: int, stdout: str, stderr: str) -> tuple:
    """(transactions per second, the server's CPU time a transaction in
    microseconds) of one side's pgbench run."""
    found = re.search(r"^tps = ([0-9.]+)", stdout, re.M)
    done = re.search(r"^number of transactions actually processed: (\d+)", stdout, re.M)
    ticks = [int(t) for t in re.findall(r"^server cpu (?:before|after): (\d+)$", stdout,
                                        re.M)]
    if returncode != 0 or not found or not done or len(ticks) != 2:
        raise BenchError(f"postgres under {who}: exit {returncode}: "
                         f"{(stderr or stdout).strip()[-300:]}")
    used = (ticks[1] - ticks[0]) / os.sysconf("SC_CLK_TCK") * 1e6 / max(int(done.group(1)), 1)
    return float(found.group(1)), used


def _stop(tracer: subprocess.Popen) -> None:
    """bpftrace stopped as a user stops it (SIGINT: it prints its maps), or killed
    where it does not end (60 s ran out once in a CI run; a run beside another test
    of the same server hung it for good): never left attached."""
    tracer.send_signal(signal.SIGINT)
    try:
        tracer.wait(timeout=180)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.wait()
        raise BenchError("bpftrace did not end within 180 s of SIGINT: killed")


def _bpftrace(bpftrace: str, original: str, report: str) -> subprocess.Popen:
    """bpftrace with the program on the original, once it has attached its probes."""
    tracer = subprocess.Popen([bpftrace, "-f", "json", "-o", report, "-e",
                               PROGRAM.format(path=original)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=clean_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and tracer.poll() is None:
        with contextlib.suppress(OSError):
            with open(report) as f:
                if '"attached_probes"' in f.read():
                    return tracer
        time.sleep(0.1)
    tracer.kill()
    raise BenchError(f"bpftrace did not attach: {tracer.communicate()[1].strip()[-300:]}")


def _hits(config: str, report: str) -> Optional[Dict[str, int]]:
    import json
    if config == "original":
        return None
    try:
        with open(report) as f:
            text = f.read()
        os.unlink(report)
    except OSError:
        raise BenchError(f"postgres under {config}: no report")
    try:
        if config == "urewrite stat":
            hits: Dict[str, int] = {}
            for p in json.loads(text)["probes"]:
                hits[p["name"]] = hits.get(p["name"], 0) + p["hits"]
            return hits
        # (bpftrace: one object per line, the map's "data" keyed by probe; ours: the same)
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"postgres under {config}: its report is not the JSON expected: "
                         f"{text.strip()[:120]!r}")
    for record in records:
        if record.get("type") == "map":
            data = next(iter(record["data"].values()))
            if isinstance(data, dict):
                return {k.split(":", 2)[-1] if k.startswith("usdt:") else k: v
                        for k, v in data.items()}
    raise BenchError(f"postgres under {config}: its report holds no map")


def _site_count(counts: Dict[str, Dict[str, int]]) -> int:
    return max((len(h) for h in counts.values()), default=0)


def _as_postgres(command: List[str], cwd: str) -> None:
    proc = subprocess.run(["runuser", "-u", USER, "--", *command], capture_output=True,
                          text=True, cwd=cwd, timeout=RUN_TIMEOUT)
    if proc.returncode != 0:
        raise BenchError(f"{os.path.basename(command[0])}: {proc.stderr.strip()[-300:]}")


def format_postgres_table(result: dict) -> str:
    if result.get("skipped"):
        return f"postgres: skipped: {result['skipped']}\n"
    lines = [f"postgres: {result['version']}; pgbench -c {result['clients']} -T "
             f"{result['seconds']} (TPC-B-like, scale {result['clients']}, fsync off) on each "
             f"side; each configuration beside a copy of the original, run at the same time; "
             f"ratio: the median of {result['repeat']} rounds' own (tps over the one beside "
             f"it); cpu: the server's CPU time a transaction (us), ratio: the one beside's "
             f"over it; every postgresql USDT probe",
             f"  {'':<16}{'tps':>10}{'beside':>10}{'ratio':>8}{'cpu':>8}{'ratio':>8}"
             f"{'transactions counted':>24}"]
    for config in CONFIGS:
        if config not in result["median_tps"]:
            lines.append(f"  {config:<16}{'-':>10}  ({result['kernel_skipped']})")
            continue
        counted = result["transactions_counted"].get(config)
        rounds = result["round_ratios"][config]
        cpu_rounds = result["round_cpu_ratios"][config]
        lines.append(f"  {config:<16}{result['median_tps'][config]:>10.1f}"
                     f"{result['median_reference_tps'][config]:>10.1f}"
                     f"{result['ratio'][config]:>8.3f}"
                     f"{result['median_cpu_us'][config]:>8.1f}{result['cpu_ratio'][config]:>8.3f}"
                     f"{'' if counted is None else f'{counted:,}':>24}" +
                     (f"  (rounds: {', '.join(f'{x:.3f}' for x in rounds)}; cpu: "
                      f"{', '.join(f'{x:.3f}' for x in cpu_rounds)})" if len(rounds) > 1 else ""))
    return "\n".join(lines) + "\n"
