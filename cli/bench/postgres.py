"""PostgreSQL (--postgres): Debian's PostgreSQL 15 under pgbench, as people run it (started
by pg_ctl as the postgres user), with its 71 USDT probe sites of provider `postgresql`:

    original          the server as installed, no probe
    urewrite stat     the server rewritten with every USDT probe, armed, counting
    urewrite run      the same rewrite, with a program keyed by probe:
                      usdt:...:postgresql:* { @[probe] = count(); }
    bpftrace          the same program on the original, with kernel uprobes

Transactions per second of each (the median of `repeat` interleaved rounds), and its ratio
to the original's: the median of each round's ratio to the original's of that round (the
order of the configurations turns by one each round, so that none is always first after
a cluster's set-up; a run's TPS moves by 10% from round to round on a shared machine, a
round's configurations together move less). A throwaway cluster in a temporary
directory, on a Unix socket only; never Debian's own service. Root only: the server runs
as the postgres user.
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

# One run, as the postgres user: start the server BINARY on a socket in DIR, fill the
# tables (pgbench -i), run pgbench for SECONDS with CLIENTS clients, stop. Around the
# pgbench run, the CPU time (clock ticks) the server's processes have used: the
# postmaster's own and its reaped children's, and its live children's (the backends
# exit when pgbench's connections close; a moment later the postmaster has reaped them).
WORKLOAD = """set -e
binary=$1 dir=$2 seconds=$3 clients=$4
conn="-h $dir/socket -p 5498 -U postgres"
{bin}/pg_ctl -D "$dir/data" -p "$binary" -l "$dir/server.log" \\
    -o "-k $dir/socket -p 5498 -c listen_addresses= -c autovacuum=off -c fsync=off -c jit=off" \\
    -w start > /dev/null
trap '{bin}/pg_ctl -D "$dir/data" -m fast -w stop > /dev/null' EXIT
{bin}/pgbench $conn -i -q postgres > /dev/null 2>&1
cpu() {{
    pm=$(head -n 1 "$dir/data/postmaster.pid")
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pm="$pm" \\
        '$1 == pm {{ t += $14 + $15 + $16 + $17 }} $4 == pm {{ t += $14 + $15 }} END {{ print t }}'
}}
sleep 0.5
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


def postgres_bench(seconds: int = 10, repeat: int = 3, clients: int = 4,
                   kernel: bool = True) -> dict:
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
    probed = os.path.join(root, "postgres.probed")
    proc = subprocess.run([sys.executable, "-m", "urewrite", original, "-p", "usdt:postgresql:*",
                           "-q", "-o", probed], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot rewrite postgres: {proc.stderr.strip()}")
    script = os.path.join(root, "workload.sh")
    with open(script, "w") as f:
        f.write(WORKLOAD.format(bin=BIN))
    for d in ("data", "socket"):
        os.mkdir(os.path.join(root, d), 0o700)
    for path in (root, probed, script, os.path.join(root, "data"), os.path.join(root, "socket")):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(root, 0o755)
    os.chmod(probed, 0o755)
    _as_postgres([os.path.join(BIN, "initdb"), "-D", os.path.join(root, "data"), "-A", "trust",
                  "-U", USER, "--no-sync", "-E", "UTF8", "--locale", "C"], root)
    version = subprocess.run([original, "--version"], capture_output=True,
                             text=True).stdout.strip()
    skipped = None if bpftrace else ("--no-kernel" if not kernel else "bpftrace not installed")
    tps: Dict[str, List[float]] = {c: [] for c in CONFIGS}
    cpu: Dict[str, List[float]] = {c: [] for c in CONFIGS}
    counts: Dict[str, Dict[str, int]] = {}
    configs = [c for c in CONFIGS if c != "bpftrace" or bpftrace]
    for r in range(repeat):
        for config in configs[r % len(configs):] + configs[:r % len(configs)]:
            log(f"postgres: round {r + 1}/{repeat}, {config}")
            got, hits, used = _one_run(config, root, original, probed, script, seconds,
                                       clients, bpftrace)
            tps[config].append(got)
            cpu[config].append(used)
            if hits is not None:
                counts[config] = hits
    medians = {c: statistics.median(v) for c, v in tps.items() if v}
    ratios = {c: [a / b for a, b in zip(v, tps["original"])] for c, v in tps.items() if v}
    # the server's CPU time a transaction: the original's over each's, round by round
    # (what the probes cost the server itself, which the machine's spread moves less)
    cpu_ratios = {c: [b / a for a, b in zip(v, cpu["original"])] for c, v in cpu.items() if v}
    return {"version": version, "seconds": seconds, "clients": clients, "repeat": repeat,
            "sites": _site_count(counts), "tps": tps, "median_tps": medians,
            "ratio": {c: statistics.median(v) for c, v in ratios.items()},
            "round_ratios": ratios, "cpu_us_per_transaction": cpu,
            "median_cpu_us": {c: statistics.median(v) for c, v in cpu.items() if v},
            "cpu_ratio": {c: statistics.median(v) for c, v in cpu_ratios.items()},
            "round_cpu_ratios": cpu_ratios,
            "transactions_counted": {c: h.get("postgresql:transaction__start", 0)
                                     for c, h in counts.items()},
            "kernel_skipped": skipped}


def _one_run(config: str, root: str, original: str, probed: str, script: str, seconds: int,
             clients: int, bpftrace: Optional[str]) -> tuple:
    """(transactions per second, hits by probe name or None, the server's CPU time a
    transaction in microseconds) of one pgbench run."""
    binary = original if config in ("original", "bpftrace") else probed
    workload = ["runuser", "-u", USER, "--", "sh", script, binary, root, str(seconds),
                str(clients)]
    report = os.path.join(root, "report.out")
    if config == "urewrite stat":
        command = [sys.executable, "-m", "urewrite", "stat", "--json", "-o", report, "--"]
    elif config == "urewrite run":
        # (the rewrite by its name in the directory, as `probe` names it: a string)
        command = [sys.executable, "-m", "urewrite", "run", "--json", "-e",
                   PROGRAM.format(path=os.path.basename(probed)), "-o", report, "--"]
    else:
        command = []
    # bpftrace attaches to the file for every process (with -c, it looks for the probes
    # in the command's own process: runuser has none)
    tracer = _bpftrace(bpftrace, original, report) if config == "bpftrace" else None
    try:
        proc = subprocess.run(command + workload, capture_output=True, text=True, cwd=root,
                              env=clean_env(), timeout=RUN_TIMEOUT + seconds)
    finally:
        if tracer is not None:
            _stop(tracer)
    found = re.search(r"^tps = ([0-9.]+)", proc.stdout, re.M)
    done = re.search(r"^number of transactions actually processed: (\d+)", proc.stdout, re.M)
    ticks = [int(t) for t in re.findall(r"^server cpu (?:before|after): (\d+)$", proc.stdout,
                                        re.M)]
    if proc.returncode != 0 or not found or not done or len(ticks) != 2:
        raise BenchError(f"postgres under {config}: exit {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    used = (ticks[1] - ticks[0]) / os.sysconf("SC_CLK_TCK") * 1e6 / max(int(done.group(1)), 1)
    return float(found.group(1)), _hits(config, report), used


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
    if config == "urewrite stat":
        hits: Dict[str, int] = {}
        for p in json.loads(text)["probes"]:
            hits[p["name"]] = hits.get(p["name"], 0) + p["hits"]
        return hits
    for line in text.splitlines():  # (bpftrace: one object per line, the map's "data" is
        record = json.loads(line)  # keyed by probe; ours: the same shape)
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
             f"{result['seconds']} (TPC-B-like, fsync off), median of {result['repeat']} "
             f"rounds; every postgresql USDT probe; ratio: the median of the rounds' own; "
             f"cpu: the server's CPU time a transaction (us), ratio: the original's over it",
             f"  {'':<16}{'tps':>10}{'ratio':>8}{'cpu':>8}{'ratio':>8}"
             f"{'transactions counted':>24}"]
    for config in CONFIGS:
        if config not in result["median_tps"]:
            lines.append(f"  {config:<16}{'-':>10}  ({result['kernel_skipped']})")
            continue
        counted = result["transactions_counted"].get(config)
        rounds = result.get("round_ratios", {}).get(config, [])
        cpu_rounds = result.get("round_cpu_ratios", {}).get(config, [])
        lines.append(f"  {config:<16}{result['median_tps'][config]:>10.1f}"
                     f"{result['ratio'][config]:>8.3f}"
                     f"{result['median_cpu_us'][config]:>8.1f}{result['cpu_ratio'][config]:>8.3f}"
                     f"{'' if counted is None else f'{counted:,}':>24}" +
                     (f"  (rounds: {', '.join(f'{x:.3f}' for x in rounds)}; cpu: "
                      f"{', '.join(f'{x:.3f}' for x in cpu_rounds)})"
                      if config != "original" and len(rounds) > 1 else ""))
    return "\n".join(lines) + "\n"
