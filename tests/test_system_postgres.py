"""Debian's PostgreSQL 15 as people run it: initialised, started through `pg_ctl` as the
postgres user (root starts it, the server runs as another user), a SQL script and pgbench.

The server is rewritten with every `postgresql` USDT probe and a few functions at entry and
return, then run under `urewrite stat`: its query results must be the original's, and its
counts those of kernel uprobes on the original running the same work. Never Debian's own
service: a cluster of the test's own in a temporary directory, on a Unix socket only.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import function_symbols, stat, urewrite

BIN = Path("/usr/lib/postgresql/15/bin")
POSTGRES = BIN / "postgres"
USER = "postgres"
PORT = 5499
FUNCTIONS = ["pg_parse_query", "PortalRun", "CommitTransactionCommand", "standard_ExecutorRun", "heap_insert"]

# Counts that depend on timing, not on the work: how often a lock is contended (close to the
# kernel's), and how often the WAL writer wakes (any number, each start with its done)
CONTENDED = {f"postgresql:{n}" for n in ("lwlock__acquire", "lwlock__release", "lwlock__condacquire")}
PAIRED = [(f"postgresql:{n}__start", f"postgresql:{n}__done")
          for n in ("lwlock__wait", "wal__buffer__write__dirty")]
# LWLockAcquireOrWait either gets the lock or, when another process holds it, fails:
# which of the two depends on timing, the calls (their sum) do not
EITHER = [("postgresql:lwlock__acquire__or__wait", "postgresql:lwlock__acquire__or__wait__fail")]
TIMED = CONTENDED | {n for pair in PAIRED + EITHER for n in pair}

# A script whose results do not depend on time, run by one client, then pgbench with a seed:
# every count below is the same from run to run.
SQL = r"""
create table t (id int primary key, name text, score numeric);
insert into t select i, 'n' || i, (i * 7) % 101 from generate_series(1, 2000) i;
create index on t (name);
select count(*), sum(score), min(name), max(name) from t;
update t set score = score + 1 where id % 3 = 0;
delete from t where id % 7 = 0;
begin; insert into t values (100000, 'x', 1); rollback;
select id, name, score from t where name like 'n19%' order by id limit 5;
with recursive f(n, v) as (select 1, 1::numeric union all select n + 1, v * (n + 1) from f where n < 25)
  select max(v) from f;
select string_agg(name, ',' order by id) from t where id < 20;
vacuum t;
select relname, n_live_tup > 0 from pg_stat_user_tables order by relname;
"""

pytestmark = [
    pytest.mark.skipif(not POSTGRES.exists(), reason="needs Debian's postgresql-15"),
    pytest.mark.skipif(os.geteuid() != 0, reason="starts the server as the postgres user: needs root"),
]


def _user_ids() -> Tuple[int, int]:
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no {USER} user (Debian's postgresql-15 makes it)")
    return entry.pw_uid, entry.pw_gid


def usdt_sites(path) -> Dict[str, List[Tuple[int, int]]]:
    """provider:name -> [(address, semaphore)], read with readelf, not with urewrite."""
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    sites: Dict[str, List[Tuple[int, int]]] = {}
    for provider, name, location, semaphore in re.findall(
            r"Provider: (\S+)\s+Name: (\S+)\s+Location: (0x[0-9a-f]+), Base: \S+, "
            r"Semaphore: (0x[0-9a-f]+)", out):
        sites.setdefault(f"{provider}:{name}", []).append((int(location, 16), int(semaphore, 16)))
    return sites


class Cluster:
    """A throwaway cluster owned by the postgres user, in a directory it can reach."""

    def __init__(self, root: Path, postgres: Path):
        self.root, self.postgres = root, postgres
        self.data, self.socket = root / "data", root / "socket"
        self.script, self.results = root / "script.sql", root / "results.txt"

    def initdb(self) -> None:
        shutil.rmtree(self.data, ignore_errors=True)
        for d in (self.data, self.socket):
            d.mkdir(mode=0o700, exist_ok=True)
        self.script.write_text(SQL)
        uid, gid = _user_ids()
        for p in (self.root, self.data, self.socket, self.script):
            os.chown(p, uid, gid)
        self.as_user([str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER,
                      "--no-sync", "-E", "UTF8", "--locale", "C"])

    def workload(self) -> str:
        """The commands of one run, for `sh -c` as the postgres user."""
        conn = f"-h {self.socket} -p {PORT} -U {USER}"
        options = (f"-k {self.socket} -p {PORT} -c listen_addresses= -c autovacuum=off "
                   f"-c fsync=off -c synchronous_commit=on -c jit=off")
        return "; ".join([
            "set -e",
            f"{BIN}/pg_ctl -D {self.data} -p {self.postgres} -l {self.root}/server.log "
            f"-o '{options}' -w start > /dev/null",
            f"{BIN}/psql {conn} -X -q -v ON_ERROR_STOP=1 -d postgres -f {self.script} "
            f"> {self.results}",
            f"{BIN}/pgbench {conn} -i -q postgres > /dev/null 2>&1",
            f"{BIN}/pgbench {conn} -n -c 1 -t 300 --random-seed=7 postgres > /dev/null",
            f"{BIN}/psql {conn} -X -A -t -d postgres -c "
            f"'select sum(abalance), count(*), sum(bbalance) from pgbench_accounts, "
            f"(select sum(bbalance) bbalance from pgbench_branches) b' >> {self.results}",
            f"{BIN}/pg_ctl -D {self.data} -m fast -w stop > /dev/null",
        ])

    def as_user(self, command: List[str]) -> subprocess.CompletedProcess:
        proc = subprocess.run(["runuser", "-u", USER, "--", *command], capture_output=True,
                              text=True, cwd=self.root, timeout=300)
        assert proc.returncode == 0, f"{command[0]}: exit {proc.returncode}\n{proc.stderr}"
        return proc

    def run(self) -> str:
        """The workload against a fresh cluster; its query results."""
        self.as_user(["sh", "-c", self.workload()])
        return self.results.read_text()


@pytest.fixture(scope="module")
def workdir():
    _user_ids()
    # pytest's own temporary directories are root's alone: the server could not reach them
    root = Path(tempfile.mkdtemp(prefix="urewrite-pg-"))
    os.chmod(root, 0o755)
    uid, gid = _user_ids()
    os.chown(root, uid, gid)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def probed(workdir) -> Path:
    out = workdir / "postgres.probed"
    specs = ["-p", "usdt:postgresql:*"]
    for f in FUNCTIONS:
        specs += ["-p", f, "-r", f]
    proc = urewrite(str(POSTGRES), *specs, "-q", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    os.chmod(out, 0o755)
    return out


def test_every_postgresql_probe_and_the_functions_are_placed(probed):
    proc = urewrite(str(POSTGRES), "-p", "usdt:postgresql:*", "--json", "-o", str(probed) + ".2")
    assert proc.returncode == 0, proc.stderr
    placed = [p for p in json.loads(proc.stdout)["probes"]]
    os.unlink(str(probed) + ".2")
    assert {p["name"] for p in placed} == set(usdt_sites(POSTGRES))
    assert sorted(p["address"] for p in placed) == \
        sorted(a for sites in usdt_sites(POSTGRES).values() for a, _ in sites)


def test_server_under_stat_answers_as_the_original_with_the_kernels_counts(
        workdir, probed, uprobes, tmp_path):
    original = Cluster(workdir / "original", POSTGRES)
    rewritten = Cluster(workdir / "rewritten", probed)
    for c in (original, rewritten):
        c.root.mkdir(exist_ok=True)
        os.chmod(c.root, 0o755)
        c.initdb()

    # the oracle: kernel uprobes on the original's sites and function entries
    sites = usdt_sites(POSTGRES)
    symbols = function_symbols(POSTGRES)
    addresses, semaphores = {}, {}
    for name, places in sites.items():
        for i, (address, semaphore) in enumerate(places):
            addresses[f"{name}#{i}"] = address
            semaphores[f"{name}#{i}"] = semaphore
    for f in FUNCTIONS:
        addresses[f] = symbols[f]
    results = {}
    kernel = uprobes.count(POSTGRES, addresses, lambda: results.setdefault("r", original.run()),
                           semaphores=semaphores)
    expected = {name: sum(kernel[f"{name}#{i}"] for i in range(len(places)))
                for name, places in sites.items()}
    expected.update({f: kernel[f] for f in FUNCTIONS})

    run = stat(["runuser", "-u", USER, "--", "sh", "-c", rewritten.workload()], tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    assert rewritten.results.read_text() == results["r"]
    counted = {p["name"]: 0 for p in run.probes}
    for p in run.probes:
        if p["kind"] in ("usdt", "entry"):
            counted[p["name"]] += p["hits"]
    counted = {n: counted.get(n, 0) for n in expected}
    assert {n: c for n, c in counted.items() if n not in TIMED} == \
        {n: c for n, c in expected.items() if n not in TIMED}
    for n in CONTENDED:
        assert abs(counted[n] - expected[n]) <= max(200, expected[n] // 50), (n, counted[n], expected[n])
    for got, failed in EITHER:
        assert counted[got] + counted[failed] == expected[got] + expected[failed]
    for start, done in PAIRED:
        assert counted[start] == counted[done]
    assert expected["postgresql:query__start"] > 300  # the work really ran
    # every return of the functions probed at both ends is seen, and timed
    for f in FUNCTIONS:
        returns = [p for p in run.probes if p["name"] == f and p["kind"] == "return"]
        assert returns and sum(p["hits"] for p in returns) == expected[f]


def test_bench_postgres_runs_every_configuration():
    """`bench --postgres`'s part, briefly: every configuration runs pgbench beside the
    reference (a copy of the original) at the same time, both sides' figures are read,
    the probes of each configuration counted its own transactions, and each server's
    CPU time a transaction is measured (a backend's transaction takes some tens of
    microseconds to a few ms)."""
    from urewrite.bench.postgres import format_postgres_table, postgres_bench
    _user_ids()
    result = postgres_bench(seconds=1, repeat=1)
    assert not result.get("skipped"), result
    configs = {"original", "urewrite stat", "urewrite run"} | \
        ({"bpftrace"} if not result["kernel_skipped"] else set())
    assert set(result["median_tps"]) == configs
    assert all(tps > 0 for tps in result["median_tps"].values())
    assert set(result["median_reference_tps"]) == configs
    assert all(tps > 0 for tps in result["median_reference_tps"].values())
    for config in configs:  # (each ratio is its own run's two figures)
        assert result["round_ratios"][config] == [
            a / b for a, b in zip(result["tps"][config], result["reference_tps"][config])]
    for config in configs - {"original"}:  # (its own: the reference's are not counted)
        counted, tps = result["transactions_counted"][config], result["tps"][config][0]
        assert 100 < counted < 1.5 * tps + 500, (config, result)
    assert set(result["median_cpu_us"]) == set(result["cpu_ratio"]) == configs
    assert all(10 < us < 100_000 for us in result["median_cpu_us"].values()), result
    assert "urewrite run" in format_postgres_table(result)
