"""The regions as Prometheus metrics, read at every scrape (`urewrite export`).

The official client (`prometheus_client`) writes the exposition format; this
module only says what the metrics are, in a custom collector that reads the
regions when Prometheus asks:

- `urewrite_probe_hits_total{object, probe, kind, pid}`: a counter per probe and
  process (regions of one object in one pid, as after an exec, add up);
- `urewrite_probe_latency_seconds{object, probe, pid}`: a histogram per function
  probed at entry and return. The runtime keeps log2 buckets of whole
  nanoseconds, bucket k holding [2^(k-1), 2^k - 1] ns, so `le` is (2^k - 1) ns
  in seconds: every bound is exact. It keeps no sum: `_sum` counts each sample
  at its bucket's midpoint, within -25% and +50% of the true sum;
- `urewrite_ring_events_total` and `urewrite_ring_lost_events_total{object, pid}`:
  events written to a traced process's ring, and those its writers dropped
  (their record was busy);
- `urewrite_returns_missed_total{object, pid}`: calls whose return address could
  not be redirected, so their returns are missing from the counts;
- `urewrite_latency_missed_total{object, pid}`: returns of functions probed at entry
  and return that gave no latency sample (docs/region.md, `latency_missed`);
- `urewrite_regions`: region files read at this scrape;
- `urewrite_program_map{map, key, field}` and `urewrite_program_map_bucket{map, key,
  low, high}`: the maps of programs built into the probes (docs/programs.md) that the
  processes of a watched directory keep: a map's key is one label (its parts as
  `urewrite run` prints them, comma-separated; "" for a map without keys), `field`
  says which of stats()'s values a series is ("" for the others), and a histogram's
  buckets are series of their own, by their bounds.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Tuple

from urewrite.errors import UrewriteError
from urewrite.reader.snapshots import Snapshot, Watcher

# le bounds: (2^k - 1) ns for k = 1 .. LAST_BUCKET (2^36 ns is about 69 s), then +Inf
LAST_BUCKET = 36


def latency_buckets(counts: List[int]) -> Tuple[List[Tuple[str, float]], float]:
    """Cumulative (le, count) pairs in seconds, +Inf last, and the estimated sum."""
    from prometheus_client.utils import floatToGoString

    buckets, seen = [], 0
    for k, count in enumerate(counts):
        seen += count
        if 1 <= k <= LAST_BUCKET:
            buckets.append((floatToGoString(((1 << k) - 1) / 1e9), seen))
    buckets.append(("+Inf", seen))
    estimate = sum(count * (((1 << (k - 1)) + (1 << k) - 1) / 2)
                   for k, count in enumerate(counts) if k) / 1e9
    return buckets, estimate


class RegionCollector:
    """A prometheus_client collector: one snapshot of the source per scrape."""

    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.lock = threading.Lock()  # scrapes may overlap; a watcher reads one at a time

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        with self.lock:
            snap = self.watcher.snapshot()
        hits = CounterMetricFamily("urewrite_probe_hits", "Probe hits, per process.",
                                   labels=["object", "probe", "kind", "pid"])
        latency = HistogramMetricFamily(
            "urewrite_probe_latency_seconds",
            "Time from entry to return of functions probed at both (log2 buckets; _sum "
            "estimated from bucket midpoints).", labels=["object", "probe", "pid"])
        events = CounterMetricFamily("urewrite_ring_events", "Events written to the trace "
                                     "ring.", labels=["object", "pid"])
        lost = CounterMetricFamily("urewrite_ring_lost_events", "Events the writers dropped: "
                                   "their ring record was busy.", labels=["object", "pid"])
        missed = CounterMetricFamily("urewrite_returns_missed", "Calls whose return address "
                                     "could not be redirected: their returns are not counted.",
                                     labels=["object", "pid"])
        unsampled = CounterMetricFamily("urewrite_latency_missed", "Returns of functions "
                                        "probed at entry and return that gave no latency "
                                        "sample.", labels=["object", "pid"])
        for labels, value in _per_probe(snap).items():
            hits.add_metric(list(labels), value)
        for labels, counts in _histograms(snap).items():
            buckets, estimate = latency_buckets(counts)
            latency.add_metric(list(labels), buckets, estimate)
        for labels, (n_events, n_lost, n_missed, traced, n_unsampled) in \
                _per_region(snap).items():
            if traced:
                events.add_metric(list(labels), n_events)
                lost.add_metric(list(labels), n_lost)
            missed.add_metric(list(labels), n_missed)
            unsampled.add_metric(list(labels), n_unsampled)
        yield hits
        yield latency
        yield events
        yield lost
        yield missed
        yield unsampled
        yield GaugeMetricFamily("urewrite_regions", "Region files read at this scrape.",
                                value=len(snap.regions))
        directory = getattr(self.watcher.source, "directory", None)
        if directory is not None:
            yield from program_maps(directory)


def program_maps(directory: str):
    """The metric families of the built-in programs' maps in `directory`."""
    from prometheus_client.core import GaugeMetricFamily
    from urewrite.programs.output import entries
    from urewrite.reader.probe_programs import built_in_maps, loaded_maps

    values = GaugeMetricFamily("urewrite_program_map", "A value of a map of a probe "
                               "program (built into the probes, or loaded by urewrite run).", labels=["map", "key", "field"])
    buckets = GaugeMetricFamily("urewrite_program_map_bucket", "A histogram bucket of a map "
                                "of a probe program.",
                                labels=["map", "key", "low", "high"])
    for maps, _, _ in built_in_maps(directory) + loaded_maps(directory):
        for data in maps:
            for key, value in entries(data):
                _add_map_value(values, buckets, f"@{data.name}", key, value)
    return [values, buckets]


def _add_map_value(values, buckets, name: str, key: str, value) -> None:
    if isinstance(value, list):  # a histogram: its buckets
        for b in value:
            buckets.add_metric([name, key, str(b.get("min", "")), str(b.get("max", ""))],
                               b["count"])
    elif isinstance(value, dict):  # stats(): count, average, total
        for field, number in value.items():
            values.add_metric([name, key, field], number)
    else:
        values.add_metric([name, key, ""], value)


def _per_probe(snap: Snapshot) -> Dict[tuple, int]:
    out: Dict[tuple, int] = {}
    for r in snap.regions.values():
        for i, key in r.keys():
            labels = (r.object, key.name, key.kind, str(r.pid))
            out[labels] = out.get(labels, 0) + r.counts.hits[i]
    return out


def _histograms(snap: Snapshot) -> Dict[tuple, List[int]]:
    out: Dict[tuple, List[int]] = {}
    for r in snap.regions.values():
        for i, key in r.keys():
            counts = r.counts.histograms[i]
            if counts is not None:
                labels = (r.object, key.name, str(r.pid))
                old = out.get(labels, [0] * len(counts))
                out[labels] = [a + b for a, b in zip(old, counts)]
    return out


def _per_region(snap: Snapshot) -> Dict[tuple, tuple]:
    out: Dict[tuple, tuple] = {}
    for r in snap.regions.values():
        labels = (r.object, str(r.pid))
        events, lost, missed, traced, unsampled = out.get(labels, (0, 0, 0, False, 0))
        c = r.counts
        out[labels] = (events + c.ring_events, lost + c.ring_dropped,
                       missed + c.returns_missed, traced or c.traced,
                       unsampled + c.latency_missed)
    return out


@contextmanager
def serve(source, host: str, port: int,
          on_problem: Callable[[str], None]) -> Iterator[str]:
    """Serve /metrics for the regions of `source` (sources.py) while the block
    runs; yields the URL."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise UrewriteError("export needs the prometheus-client package "
                            "(pip install prometheus-client)")
    watcher = Watcher(source, on_problem)
    registry = CollectorRegistry(auto_describe=False)
    collector = RegionCollector(watcher)
    registry.register(collector)
    try:
        started = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        watcher.close()
        raise UrewriteError(f"cannot listen on {host}:{port}: {e.strerror or e}")
    if not started:  # before 0.17 it returned nothing: no port to show, no way to stop
        watcher.close()
        raise UrewriteError("export needs prometheus-client 0.17 or newer")
    server, thread = started
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{shown}:{bound}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        with collector.lock:  # a scrape still being answered finishes first
            watcher.close()
