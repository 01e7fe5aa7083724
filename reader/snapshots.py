"""What live views read from regions over time.

A `Watcher` over a source (sources.py) keeps each file mapped read-only
(`LiveRegion`) and takes `Snapshot`s: every probe's hits and latency buckets per
region, at one time. Two snapshots give what happened between them (`changes`):
hits, hits/s and latency samples per probe, with regions that appeared in between
counted from zero and regions that went away left out.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from urewrite.trampolines import region as R
from urewrite.trampolines.live_region import LiveProbe, LiveRegion, RegionCounts, open_live
from urewrite.trampolines.region_reader import TableCache


class ProbeKey(NamedTuple):
    """A probe as stat totals it: processes of one object add up. (A tuple: hashed in
    C, a million times a snapshot of many processes of a big program.)"""
    object: str
    name: str
    kind: str
    address: int


@dataclass
class RegionSample:
    path: str
    pid: int
    object: str
    probes: Tuple[LiveProbe, ...]
    counts: RegionCounts
    probe_keys: Tuple[ProbeKey, ...]  # (the Watcher makes them once per object and table)

    def keys(self) -> Iterable[Tuple[int, ProbeKey]]:
        return enumerate(self.probe_keys)


def _keys(obj: str, probes: Tuple[LiveProbe, ...]) -> Tuple[ProbeKey, ...]:
    return tuple(ProbeKey(obj, p.name, p.kind, p.address) for p in probes)


@dataclass
class Snapshot:
    time: float  # time.monotonic()
    regions: Dict[tuple, RegionSample] = field(default_factory=dict)  # (path, inode) -> sample

    def totals(self) -> Dict[ProbeKey, int]:
        out: Dict[ProbeKey, int] = {}
        for r in self.regions.values():
            for i, key in r.keys():
                out[key] = out.get(key, 0) + r.counts.hits[i]
        return out

    def untimed(self) -> bool:
        """Whether a process has functions probed at entry and return whose calls it
        does not time (latency not asked for): their latency reads as none."""
        return any(not r.counts.timed and any(p.histogram >= 0 for p in r.probes)
                   for r in self.regions.values())

    def as_regions(self) -> List[R.Region]:
        """The regions as `read_regions` gives them, for stat's report."""
        out = []
        for r in self.regions.values():
            region = R.Region(r.path, r.pid, r.object, "", 0, 0,
                              returns_missed=r.counts.returns_missed,
                              latency_missed=r.counts.latency_missed, timed=r.counts.timed)
            region.probes = [R.ProbeCount(p.name, p.kind, p.address, r.counts.hits[i],
                                          r.counts.histograms[i])
                             for i, p in enumerate(r.probes)]
            out.append(region)
        return out


class Watcher:
    """Keeps the regions of a source mapped and reads them on demand.

    A file not set up yet is retried at the next snapshot; one that cannot be read
    is reported once through `on_problem` and skipped from then on; a file replaced
    under the same name (another inode) is a new region."""

    def __init__(self, source, on_problem: Optional[Callable[[str], None]] = None):
        self.source = source
        self.on_problem = on_problem or (lambda message: None)
        self._open: Dict[str, LiveRegion] = {}
        self._bad: Dict[str, tuple] = {}  # path -> inode it had when it failed
        self._tables = TableCache()  # processes of one rewrite share a probe table
        self._keys: Dict[tuple, Tuple[ProbeKey, ...]] = {}

    def _identity(self, path: str) -> Optional[tuple]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _region(self, path: str) -> Optional[LiveRegion]:
        inode = self._identity(path)
        live = self._open.get(path)
        if live is not None and live.inode != inode:
            live.close()
            del self._open[path]
            live = None
        if live is None and inode is not None and self._bad.get(path) != inode:
            try:
                live = open_live(path, self._tables)
            except R.RegionError as e:
                self._bad[path] = inode
                self.on_problem(str(e))
            if live is not None:
                self._open[path] = live
        return live

    def snapshot(self) -> Snapshot:
        paths = self.source.paths()
        for gone in set(self._open) - set(paths):
            self._open.pop(gone).close()
        snap = Snapshot(time.monotonic())
        for path in paths:
            live = self._region(path)
            if live is not None:
                keys = self._keys.get((live.object, id(live.probes)))
                if keys is None:
                    keys = self._keys[live.object, id(live.probes)] = _keys(live.object,
                                                                            live.probes)
                snap.regions[(path, live.inode)] = RegionSample(
                    path, live.pid, live.object, live.probes, live.read(), keys)
        return snap

    def close(self) -> None:
        for live in self._open.values():
            live.close()
        self._open.clear()


@dataclass
class ProbeChange:
    key: ProbeKey
    hits: int  # between the two snapshots
    total: int  # in the later one
    per_second: float
    histogram: Optional[List[int]]  # latency samples between the two, per log2 bucket


def changes(before: Snapshot, after: Snapshot) -> List[ProbeChange]:
    """What each probe of `after` did since `before`, in the order stat lists them."""
    seconds = max(after.time - before.time, 1e-9)
    rows: Dict[ProbeKey, ProbeChange] = {}
    for identity, r in after.regions.items():
        old = before.regions.get(identity)  # None: a region new since `before`
        hits_now, histograms_now = r.counts.hits, r.counts.histograms
        hits_then = old.counts.hits if old else None
        histograms_then = old.counts.histograms if old else None
        for i, key in r.keys():
            row = rows.get(key)
            if row is None:
                row = rows[key] = ProbeChange(key, 0, 0, 0.0, None)
            row.hits += hits_now[i] - (hits_then[i] if old else 0)
            row.total += hits_now[i]
            now = histograms_now[i]
            if now is not None:
                then = histograms_then[i] if old else None
                # most do not change in an interval (a new region's mostly hold zeros):
                # compared at C speed
                if then == now or (then is None and not any(now)):
                    if row.histogram is None:
                        row.histogram = [0] * len(now)
                    continue
                delta = now if then is None else [a - b for a, b in zip(now, then)]
                row.histogram = list(delta) if row.histogram is None else \
                    [a + b for a, b in zip(row.histogram, delta)]
    for row in rows.values():
        row.per_second = row.hits / seconds
    return list(rows.values())


def percentile_ns(buckets: Optional[List[int]], q: float) -> Optional[int]:
    """The upper bound, in ns, of the log2 bucket (0: under 1 ns; k: [2^(k-1), 2^k))
    holding the q-quantile of the samples: the quantile is below it. None without
    samples."""
    if not buckets:
        return None
    total = sum(buckets)
    if total <= 0:
        return None
    rank = max(1, math.ceil(Fraction(str(q)) * total))  # exact: 0.99 * 100 is 99, not 99.0000001
    seen = 0
    for k, count in enumerate(buckets):
        seen += count
        if seen >= rank:
            return 1 << k
    return 1 << (len(buckets) - 1)
