"""`urewrite export`: /metrics as the Prometheus client writes it, and what a real
Prometheus server (Debian's `prometheus`) stores from it: the programs' exact counts."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from conftest import clean_env, urewrite
from live_service import NAP_NS, LineReader, Service, build_service, stop_all, wait_for
from prometheus_server import Prometheus

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


@pytest.fixture(scope="module")
def service(builder):
    return build_service(builder)


class Exporter:
    def __init__(self, directory, listen="127.0.0.1:0", duration=300):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "urewrite", "export", "--dir", str(directory), "--listen",
             listen, "--duration", str(duration)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
        line = LineReader(self.proc.stderr).next_line(60)
        assert line.startswith("urewrite: serving http://"), line
        self.url = line.split()[2]
        self.address = urllib.parse.urlsplit(self.url).netloc

    def families(self):
        with urllib.request.urlopen(self.url, timeout=30) as r:
            text = r.read().decode()
        return {f.name: f for f in text_string_to_metric_families(text)}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)


def _samples(family, **labels):
    return [s for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]


def _value(family, name, **labels):
    (sample,) = [s for s in _samples(family, **labels) if s.name == name]
    return sample.value


def test_metrics_page(service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    traced = Service(service, regions, {"UREWRITE_TRACE": "16"})
    plain = Service(service, regions)
    exporter = None
    try:
        traced.send("call 1000")
        traced.send("nap 10")
        plain.send("call 77")
        exporter = Exporter(regions)
        f = exporter.families()
        hits = f["urewrite_probe_hits"]
        assert hits.type == "counter"
        for s, calls in ((traced, 1000), (plain, 77)):
            assert _value(hits, "urewrite_probe_hits_total", probe="handle", kind="entry",
                          pid=str(s.pid), object="service.probed") == calls
        assert _value(hits, "urewrite_probe_hits_total", probe="nap", kind="return",
                      pid=str(traced.pid)) == 10
        latency = f["urewrite_probe_latency_seconds"]
        assert latency.type == "histogram"
        mine = _samples(latency, pid=str(traced.pid), probe="nap")
        buckets = [(float(s.labels["le"]), s.value) for s in mine if s.name.endswith("_bucket")]
        assert buckets[-1] == (float("inf"), 10)
        assert [b[1] for b in buckets] == sorted(b[1] for b in buckets)  # cumulative
        # every sample lies in [2^21, 2^22 - 1] ns or above: none below 2^21 - 1 ns
        assert dict(buckets)[((1 << 21) - 1) / 1e9] == 0
        assert _value(latency, "urewrite_probe_latency_seconds_count", pid=str(traced.pid)) == 10
        total = _value(latency, "urewrite_probe_latency_seconds_sum", pid=str(traced.pid))
        assert 10 * NAP_NS / 1e9 * 0.75 <= total <= 10 * 8.4e-3
        assert _value(latency, "urewrite_probe_latency_seconds_count", pid=str(plain.pid)) == 0
        # the traced process's ring: every counted hit wrote an event
        events = f["urewrite_ring_events"]
        assert _value(events, "urewrite_ring_events_total", pid=str(traced.pid)) == 1020
        assert not _samples(events, pid=str(plain.pid))  # no ring, no series
        assert _value(f["urewrite_ring_lost_events"], "urewrite_ring_lost_events_total",
                      pid=str(traced.pid)) == 0
        assert _value(f["urewrite_regions"], "urewrite_regions") == 2
        for s in (traced, plain):  # every return gave a sample; the series says so
            assert _value(f["urewrite_latency_missed"], "urewrite_latency_missed_total",
                          pid=str(s.pid)) == 0
        traced.send("call 5")  # read at every scrape
        assert _value(exporter.families()["urewrite_probe_hits"], "urewrite_probe_hits_total",
                      probe="handle", pid=str(traced.pid)) == 1005
        assert exporter.stop() == 0
    finally:
        if exporter:
            exporter.proc.kill()
        stop_all(traced, plain)


def test_the_maps_of_a_built_in_program_are_series(service, tmp_path):
    """A program built into the probes (urewrite IN -e PROGRAM): its maps, kept by the
    processes of the directory, are series with the map's key as a label, read again
    at every scrape."""
    from conftest import urewrite
    built = tmp_path / "service.built"
    original = service.parent / "service"
    proc = urewrite(str(original), "-e", "uprobe:service:handle { @n = count(); "
                    "@odd[arg0 % 2] = count(); @st = stats(arg0); @h = hist(arg0); }",
                    "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(built, regions)
    exporter = None
    try:
        s.send("call 100")
        exporter = Exporter(regions)
        f = exporter.families()
        values, buckets = f["urewrite_program_map"], f["urewrite_program_map_bucket"]
        assert _value(values, "urewrite_program_map", map="@n", key="", field="") == 100
        assert _value(values, "urewrite_program_map", map="@odd", key="1", field="") == 50
        assert _value(values, "urewrite_program_map", map="@st", field="total") == sum(range(100))
        assert _value(buckets, "urewrite_program_map_bucket", map="@h", low="64",
                      high="127") == 36
        s.send("call 10")
        assert _value(exporter.families()["urewrite_program_map"], "urewrite_program_map",
                      map="@n", key="", field="") == 110
        assert exporter.stop() == 0
    finally:
        if exporter:
            exporter.proc.kill()
        stop_all(s)


def test_export_errors(tmp_path):
    bad = urewrite("export", "--dir", str(tmp_path), "--listen", "nowhere")
    assert bad.returncode == 2 and "ADDR:PORT" in bad.stderr
    missing = urewrite("export", "--dir", str(tmp_path / "missing"), "--listen", "127.0.0.1:0")
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"urewrite: {tmp_path / 'missing'}: no such directory"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = urewrite("export", "--dir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
                        "--duration", "0")
    assert busy.returncode == 1
    assert busy.stderr.startswith(f"urewrite: cannot listen on 127.0.0.1:{port}: ")
    assert len(busy.stderr.strip().splitlines()) == 1


# -- a real Prometheus server ----------------------------------------------------------

def _one(found: dict) -> float:
    assert len(found) == 1, found
    return next(iter(found.values()))


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="the prometheus binary is not installed (apt-get install prometheus)")
def test_prometheus_stores_the_exact_counts(service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    running = Service(service, regions, {"UREWRITE_TRACE": "16"})
    exporter = prometheus = None
    try:
        finished = Service(service, regions)
        finished.send("call 77")
        assert finished.quit() == 0  # its region stays: counts of an exited process
        running.send("call 1000")
        running.send("nap 20")
        exporter = Exporter(regions)
        prometheus = Prometheus(exporter.address, tmp_path)

        def stored(promql, expected):
            found = {}

            def matches():
                found.clear()
                found.update(prometheus.query(promql))
                return found and all(v == expected for v in found.values()) and found
            try:
                return wait_for(matches, timeout=60, step=0.5)
            except AssertionError:
                raise AssertionError(f"{promql}: Prometheus holds {found}, not {expected}")

        pid = str(running.pid)
        assert _one(stored(f'urewrite_probe_hits_total{{probe="handle",pid="{pid}"}}',
                           1000)) == 1000
        assert _one(stored(f'urewrite_probe_hits_total{{probe="handle",pid="{finished.pid}"}}',
                           77)) == 77
        labels = dict(next(iter(stored(
            f'urewrite_probe_hits_total{{probe="nap",kind="return",pid="{pid}"}}', 20))))
        assert (labels["object"], labels["kind"], labels["job"]) == \
            ("service.probed", "return", "urewrite")
        assert _one(stored(f'urewrite_probe_latency_seconds_count{{pid="{pid}"}}', 20)) == 20
        assert _one(stored(f'urewrite_probe_latency_seconds_bucket{{pid="{pid}",le="+Inf"}}',
                           20)) == 20
        # a nap of 3 ms lies in the bucket [2^21, 2^22 - 1] ns
        median = _one(prometheus.query(
            f'histogram_quantile(0.5, urewrite_probe_latency_seconds_bucket{{pid="{pid}"}})'))
        assert ((1 << 21) - 1) / 1e9 <= median <= ((1 << 22) - 1) / 1e9
        assert _one(stored(f'urewrite_ring_events_total{{pid="{pid}"}}', 1040)) == 1040
        assert _one(stored(f'urewrite_ring_lost_events_total{{pid="{pid}"}}', 0)) == 0
        # counts that grow while the process runs reach Prometheus too
        running.send("call 500")
        assert _one(stored(f'urewrite_probe_hits_total{{probe="handle",pid="{pid}"}}',
                           1500)) == 1500
        assert _one(stored('sum(urewrite_probe_hits_total{probe="handle"})', 1577)) == 1577
    finally:
        if prometheus:
            prometheus.stop()
        if exporter:
            exporter.stop()
        stop_all(running)


def test_the_maps_of_a_program_run_loaded_are_series(service, tmp_path):
    """A program `urewrite run --dir` loaded: its maps are series while it runs."""
    from live_service import ProgramLoader, with_arguments
    built = with_arguments(service, tmp_path)
    regions = tmp_path / "regions"
    regions.mkdir()
    loader = ProgramLoader(f"uprobe:{built}:handle {{ @odd[arg0 % 2] = count(); }}", regions)
    s, exporter = None, None
    try:
        s = Service(built, regions)
        s.send("call 100")
        exporter = Exporter(regions)
        values = exporter.families()["urewrite_program_map"]
        assert _value(values, "urewrite_program_map", map="@odd", key="1", field="") == 50
        assert exporter.stop() == 0
        assert s.quit() == 0
        loader.stop()
    finally:
        loader.kill()
        if exporter:
            exporter.proc.kill()
        if s is not None:
            stop_all(s)
