"""Counts over regions, as stat reports them: hits per probe added up over processes,
and the latency histograms' buckets in use."""

from __future__ import annotations


def bucket_range(k: int) -> tuple:
    """Latency bucket k holds [lo, hi) ns: 0 is under 1 ns, k is [2^(k-1), 2^k)."""
    return (0, 1) if k == 0 else (1 << (k - 1), 1 << k)


def probe_totals(regions):
    """Hits per probe (object, name, kind, address) over the regions, in the order
    they first appear, and the latency histograms of those that have one."""
    totals, histograms = {}, {}
    for region in regions:
        obj = region.object
        for p in region.probes:
            key = (obj, p.name, p.kind, p.address)
            totals[key] = totals.get(key, 0) + p.hits
            if p.histogram is not None:
                old = histograms.get(key)
                histograms[key] = list(p.histogram) if old is None else \
                    [a + b for a, b in zip(old, p.histogram)]
    return totals, histograms


def histogram_buckets(counts) -> list:
    """The buckets from the first that holds samples to the last (none without any)."""
    used = [i for i, c in enumerate(counts) if c]
    return [{"lo_ns": bucket_range(i)[0], "hi_ns": bucket_range(i)[1], "count": counts[i]}
            for i in (range(used[0], used[-1] + 1) if used else ())]


class TableRows:
    """stat's rows for one probe table, made before its counts are known (while the
    command runs: 10 ms of a python3.11 of every function not spent after it): a row
    per distinct (object, name, kind, address), in the order they first appear, as
    probe_totals gives them, and each probe's row."""

    def __init__(self, obj: str, table):
        rows: dict = {}
        self.row_of = [rows.setdefault((obj, name, kind, address), len(rows))
                       for name, kind, address in zip(table.names, table.kinds,
                                                      table.addresses)]
        self.keys = list(rows)
        # the first probe that can hold a histogram: to_region gives all or none
        self.first_histogram = next((k for k, h in enumerate(table.histograms) if h >= 0),
                                    None)

    def totals(self, hits: list) -> list:
        """Hits per row, from each probe's (a region's, read with this table)."""
        if len(self.keys) == len(hits):
            return hits
        totals = [0] * len(self.keys)
        for row, n in zip(self.row_of, hits):
            totals[row] += n
        return totals

    def without_histograms(self, probes) -> bool:
        return self.first_histogram is None or probes[self.first_histogram].histogram is None
