"""Live views of armed processes: `top -p`, `export -p`, `stat -p --interval` (and --all).

The server (samples/live_server.c) runs without UREWRITE_DIR and works only when told,
so what a view shows is known exactly: the requests sent while it was armed. After
each view the process must be disarmed as before: its state word back to 1, no
region directory left, the USDT semaphore off, and it answers with its own totals.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import clean_env
from live_server import Server, Tracer, hits, live_dirs, state_of
from live_server import programs  # noqa: F401 (the fixture: the server and its rewrites)
from live_service import build_service, top_tables

TIMEOUT = 120


@pytest.fixture(scope="module")
def service(builder):
    return build_service(builder)


def assert_disarmed(server: Server, program) -> None:
    assert state_of(server.pid, program) == (1, b"")
    assert server.ask("enabled") == "enabled 0"
    assert server.ask("ping") == "pong"
    assert not [d for d in live_dirs() if d.startswith(f"urewrite-live-{server.pid}-")]


def totals(rows) -> dict:
    return {(r["PROBE"], r["KIND"]): int(r["TOTAL"]) for r in rows}


# -- top -p ---------------------------------------------------------------------------------

def test_top_pid_shows_the_exact_totals_then_disarms(programs):
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
        server.work(5000)  # before arming: not shown
        top = Tracer("top", "-p", server.pid, "-d", 1.5, "-n", 2)
        top.armed()
        server.work(1000)
        server.work(234)
        code, out, err = top.finish()
        assert code == 0, err
        assert "\x1b" not in out  # plain: stdout is a pipe
        tables = top_tables(out)
        assert len(tables) == 2
        for title, _ in tables:
            assert title.startswith(f"urewrite top - pid {server.pid} - 1 process, 3 probes - "
                                    f"every 1.5 s")
            # (handle_request is probed at entry and return: its calls, untimed, say so)
            assert title.endswith(" - calls untimed: no latency (--latency)")
        expected = {("handle_request", "entry"): 1234, ("handle_request", "return"): 1234,
                    ("live:batch", "usdt"): 2}
        (_, first), (_, second) = tables
        assert totals(first) == totals(second) == expected
        assert first[0]["PROBE"] == "handle_request" and float(first[0]["HITS/S"]) > 0
        assert {float(r["HITS/S"]) for r in second} == {0.0}  # nothing in the second interval
        assert_disarmed(server, program)
        server.work(77)  # runs as before, counting on from its own total
        # and it can be armed again, with the same exact counts
        stat = Tracer("stat", "--json", "-p", server.pid, "--duration", 1)
        stat.armed()
        server.work(321)
        code, out, err = stat.finish()
        assert code == 0, err
        assert hits(json.loads(out), "handle_request") == 321
        assert not any("histogram" in p for p in json.loads(out)["probes"])  # calls untimed
        assert_disarmed(server, program)
        # armed once more, timing calls: a sample per call, then untimed again
        for latency, samples in ((True, 55), (False, None)):
            stat = Tracer("stat", "--json", "-p", server.pid, "--duration", 1,
                          *["--latency"] * latency)
            stat.armed()
            server.work(55)
            code, out, err = stat.finish()
            assert code == 0, err
            (ret,) = [p for p in json.loads(out)["probes"]
                      if (p["name"], p["kind"]) == ("handle_request", "return")]
            assert ret["hits"] == 55
            assert (sum(b["count"] for b in ret["histogram"]) if "histogram" in ret
                    else None) == samples
            assert json.loads(out)["calls_timed"] is latency
            assert_disarmed(server, program)
        assert server.stop() == 0


def test_top_pid_ends_when_the_process_exits_with_its_last_counts(programs):
    with Server(programs / "live_server.probed", programs / "lib") as server:
        top = Tracer("top", "-p", server.pid, "-d", 60)  # no refresh before the exit
        top.armed()
        server.work(300)
        assert server.stop() == 0
        code, out, err = top.finish()
        assert code == 0, err
        (_, rows), = top_tables(out)
        assert totals(rows)[("handle_request", "entry")] == 300


def test_top_all_sums_the_processes_of_a_file(programs):
    program = programs / "live_server.probed"
    servers = [Server(program, programs / "lib", threads=t) for t in (1, 3)]
    try:
        top = Tracer("top", "--all", program, "-d", 1.5, "--once")
        line = top.armed()
        assert all(str(s.pid) in line for s in servers), line
        servers[0].work(100)
        servers[1].work(2000)
        code, out, err = top.finish()
        assert code == 0, err
        (title, rows), = top_tables(out)
        assert " - 2 processes, 3 probes - " in title
        assert totals(rows)[("handle_request", "return")] == 2100
        for server in servers:
            assert_disarmed(server, program)
    finally:
        for server in servers:
            server.kill()


# -- stat -p --interval ---------------------------------------------------------------------

def test_stat_pid_interval_adds_up_to_the_report(programs):
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
        server.work(999)
        stat = Tracer("stat", "--json", "-p", server.pid, "--interval", 0.4, "--duration", 2)
        stat.armed()
        server.work(3000)
        server.ask("ping")
        server.work(45)
        code, out, err = stat.finish()
        assert code == 0, err
        *intervals, report = [json.loads(line) for line in out.splitlines()]
        assert len(intervals) >= 4 and all("seconds" in i for i in intervals)
        for name, kind, count in (("handle_request", "entry", 3045),
                                  ("handle_request", "return", 3045),
                                  ("live:batch", "usdt", 2)):
            assert hits(report, name, kind) == count
            assert sum(p["hits"] for i in intervals for p in i["probes"]
                       if (p["name"], p["kind"]) == (name, kind)) == count
        assert report["processes"] == 1
        assert_disarmed(server, program)
        server.work(5)
        assert server.stop() == 0


def test_stat_pid_interval_on_a_busy_process_counts_from_arming(programs):
    """Armed in the middle of a long batch, the region counts from its first hit on,
    before the first read: the first interval still counts from zero, so the intervals
    add up to the report. Ctrl-C ends it between two ticks, never inside one."""
    program = programs / "live_server.probed"
    with Server(program, programs / "lib") as server:
        server.proc.stdin.write("work 100000000\n")  # seconds of work, answered at the end
        server.proc.stdin.flush()
        stat = Tracer("stat", "--json", "-p", server.pid, "--interval", 0.1)
        stat.armed()
        time.sleep(1)
        stat.proc.send_signal(signal.SIGINT)
        code, out, err = stat.finish()
        assert code == 0, err
        *intervals, report = [json.loads(line) for line in out.splitlines()]
        counted = hits(report, "handle_request")
        assert 0 < counted <= 100_000_000
        assert sum(p["hits"] for i in intervals for p in i["probes"]
                   if (p["name"], p["kind"]) == ("handle_request", "entry")) == counted
        assert server.proc.stdout.readline().strip() == "done 100000000 100000000"
        assert_disarmed(server, program)
        assert server.stop() == 0


def test_a_ticker_from_zero_counts_what_the_regions_held_before_its_first_read(service,
                                                                             tmp_path):
    """What keeps the test above exact however soon the armed process hits: regions
    that counted before the views' first read are counted from zero (from_zero)."""
    from live_service import Service, stop_all
    from urewrite.reader.snapshots import Watcher, changes
    from urewrite.reader.sources import DirectorySource
    from urewrite.reader.ticker import Ticker

    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(service, regions)
    try:
        s.send("call 1234")
        seen = []
        for from_zero in (False, True):
            watcher = Watcher(DirectorySource(str(regions)))
            ticker = Ticker(watcher, 1.0, lambda b, a: seen.append(changes(b, a)),
                            from_zero=from_zero)
            ticker.tick()
            watcher.close()
    finally:
        stop_all(s)
    later, from_arming = [{(c.key.name, c.key.kind): c.hits for c in rows} for rows in seen]
    assert later["handle", "entry"] == 0 and from_arming["handle", "entry"] == 1234


# -- export -p ------------------------------------------------------------------------------

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


class ArmedExporter(Tracer):
    """`urewrite export -p PID --listen 127.0.0.1:0`: armed, then serving."""

    def __init__(self, pid):
        super().__init__("export", "-p", pid, "--listen", "127.0.0.1:0", "--latency")
        self.armed()
        line = self.proc.stderr.readline()
        assert line.startswith("urewrite: serving http://"), line
        self.url = line.split()[2]
        self.address = self.url.split("/")[2]

    def scrape(self) -> dict:
        with urllib.request.urlopen(self.url, timeout=30) as r:
            text = r.read().decode()
        return {(s.name, s.labels.get("probe"), s.labels.get("kind"), s.labels.get("le")):
                s.value for f in text_string_to_metric_families(text) for s in f.samples}

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        return self.finish()


def test_export_pid_serves_the_exact_counts_then_disarms(programs):
    program = programs / "live_server.probed"
    server = Server(program, programs / "lib")
    exporter = None
    try:
        server.work(10)
        exporter = ArmedExporter(server.pid)
        server.work(4321)
        m = exporter.scrape()
        assert m["urewrite_probe_hits_total", "handle_request", "entry", None] == 4321
        assert m["urewrite_probe_hits_total", "handle_request", "return", None] == 4321
        assert m["urewrite_probe_hits_total", "live:batch", "usdt", None] == 1
        assert m["urewrite_probe_latency_seconds_count", "handle_request", None, None] == 4321
        assert m["urewrite_probe_latency_seconds_bucket", "handle_request", None, "+Inf"] == 4321
        assert m["urewrite_regions", None, None, None] == 1
        server.work(79)  # read again at the next scrape
        assert exporter.scrape()["urewrite_probe_hits_total", "handle_request", "entry",
                                 None] == 4400
        code, out, err = exporter.stop()
        assert code == 0, err
        assert_disarmed(server, program)
        assert server.stop() == 0
    finally:
        if exporter:
            exporter.proc.kill()
        server.kill()


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="the prometheus binary is not installed (apt-get install prometheus)")
def test_prometheus_stores_the_counts_of_an_armed_process(programs, tmp_path):
    from live_service import wait_for
    from prometheus_server import Prometheus

    program = programs / "live_server.probed"
    server = Server(program, programs / "lib")
    exporter = prometheus = None
    try:
        exporter = ArmedExporter(server.pid)
        server.work(2500)
        prometheus = Prometheus(exporter.address, tmp_path)
        query = f'urewrite_probe_hits_total{{probe="handle_request",kind="entry",' \
                f'pid="{server.pid}"}}'
        wait_for(lambda: prometheus.query(query) and
                 list(prometheus.query(query).values()) == [2500], timeout=60, step=0.5)
        code, _, err = exporter.stop()
        assert code == 0, err
        assert_disarmed(server, program)
    finally:
        if prometheus:
            prometheus.stop()
        if exporter:
            exporter.proc.kill()
        server.kill()


# -- usage ----------------------------------------------------------------------------------

def test_armed_views_refuse_bad_combinations_in_one_line(programs):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "urewrite", *map(str, args)],
                              capture_output=True, text=True, env=clean_env(), timeout=TIMEOUT)
    for args in (("top", "-p", "1", "--dir", "/tmp"), ("top", "-p", "1", "--all"),
                 ("top", "-p", "1", "--", "true"), ("export", "--listen", ":0"),
                 ("export", "-p", "1", "--dir", "/tmp", "--listen", ":0"),
                 ("stat", "-p", "1", "--dir", "/tmp"), ("top", "--duration", "1", "--", "true")):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
    for args in (("top", "-p", "2147483646", "--once"),
                 ("export", "-p", "2147483646", "--listen", "127.0.0.1:0"),
                 ("stat", "-p", "2147483646", "--interval", "1")):
        proc = run(*args)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr == "urewrite: pid 2147483646: no such process\n", proc.stderr
