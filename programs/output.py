"""Prints a program's maps as bpftrace prints them, in text and in JSON, so that what
people read, diff and parse from bpftrace reads the same from urewrite.

The rules, as bpftrace 0.17 prints (tests/test_program_output.py holds it to them):
maps in the order of their names; a map's entries by value, smallest first (a
histogram's by its total); a histogram drops its empty buckets at both ends and
draws each bar 52 characters wide at its largest count; a blank line follows each
histogram, and each avg() and stats() map (an empty one too); a map that holds nothing
prints an empty line, or `@name: 0` for a count without keys (-f json: only that
count). print(@m,
top, div) prints the largest `top` entries, values divided by `div` (a histogram's
counts, not its bars; neither an lhist()'s nor a stats()'s).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

BAR = 52  # the widest bar, in '@'

# A log2 histogram's buckets: 0 holds the negative values, 1 the zeros, and bucket
# k >= 2 the values in [2**(k-2), 2**(k-1)).
HIST_BUCKETS = 66


def hist_bucket(value: int) -> int:
    if value < 0:
        return 0
    return 1 if value == 0 else value.bit_length() + 1


def lhist_bucket(value: int, low: int, high: int, step: int) -> int:
    """Bucket 0 holds what is under `low`, the last what is at or over `high`."""
    if value < low:
        return 0
    if value >= high:
        return (high - low) // step + 1
    return (value - low) // step + 1


# a map without keys that holds nothing prints as "@name: 0" if it counts (bpftrace 0.17:
# untouched, deleted or cleared), else as an empty line (and not at all in -f json)
_ZERO_WHEN_EMPTY = ("count",)


@dataclass
class MapData:
    """One map's contents. kind: count, sum, min, max, avg, stats, hist, lhist or value
    (a plain assignment). Each entry maps a key (a tuple, empty for a map without
    keys) to an int, or for avg and stats to (count, total), or for hist and lhist to
    a list of bucket counts."""
    name: str  # without the '@'
    kind: str
    entries: Dict[Tuple, object] = field(default_factory=dict)
    lhist: Optional[Tuple[int, int, int]] = None  # low, high, step
    keyed: bool = True  # (what an empty map prints depends on it)


def _divided(value: int, div: int) -> int:
    """value / div as C divides (toward zero)."""
    quotient = abs(value) // div
    return quotient if value >= 0 else -quotient


def average(count: int, total: int) -> int:
    """bpftrace's integer average: rounded toward zero, as C divides."""
    return _divided(total, count) if count else 0


def _sort_value(data: MapData, value) -> int:
    if data.kind in ("hist", "lhist"):
        return sum(value)
    if data.kind in ("avg", "stats"):
        return average(*value)
    if isinstance(value, float):  # (a float's or a double's value; NaN first)
        return value if value == value else -math.inf
    return value if isinstance(value, int) else 0


def _ordered(data: MapData) -> List[Tuple[Tuple, object]]:
    # ties in key order, where bpftrace leaves them in its hash table's order
    return sorted(data.entries.items(), key=lambda item: (_sort_value(data, item[1]),
                                                          [str(k) for k in item[0]]))


def _key_text(key: Tuple, separator: str = ", ") -> str:
    return separator.join(str(k) for k in key)


def _size_label(number: int) -> str:
    """A log2 bucket's bound as bpftrace writes it: 1K, 2M, ..."""
    for suffix in ("E", "P", "T", "G", "M", "K"):
        unit = 1 << (10 * ("KMGTPE".index(suffix) + 1))
        if number >= unit and number % unit == 0:
            return f"{number // unit}{suffix}"
    return str(number)


def _hist_label(index: int) -> str:
    if index == 0:
        return "(..., 0)"
    if index == 1:
        return "[0]"
    if index == 2:
        return "[1]"
    return f"[{_size_label(1 << (index - 2))}, {_size_label(1 << (index - 1))})"


def _lhist_label(index: int, low: int, high: int, step: int, last: int) -> str:
    if index == 0:
        return f"(..., {low})"
    if index == last:
        return f"[{high}, ...)"
    start = low + (index - 1) * step
    return f"[{start}, {start + step})"


def _bars(labels_counts: List[Tuple[str, int]], div: int = 1) -> List[str]:
    """Each bucket's line; its count written divided by `div`, its bar drawn from the
    count itself (as bpftrace 0.17's print(@h, top, div))."""
    top = max((count for _, count in labels_counts), default=0)
    lines = []
    for label, count in labels_counts:
        width = int(count / top * BAR) if top else 0
        lines.append(f"{label:<16}{_divided(count, div):>8} |{'@' * width:<{BAR}}|")
    return lines


def _histogram_lines(data: MapData, buckets: List[int], div: int = 1) -> List[str]:
    used = [i for i, count in enumerate(buckets) if count]
    if not used:
        return []
    span = range(used[0], used[-1] + 1)
    if data.kind == "hist":  # (the buckets shown: those of the counts before division)
        return _bars([(_hist_label(i), buckets[i]) for i in span], div)
    low, high, step = data.lhist  # (whose counts bpftrace 0.17 leaves whole)
    last = (high - low) // step + 1
    return _bars([(_lhist_label(i, low, high, step, last), buckets[i]) for i in span])


def text(maps: List[MapData], top: int = 0, div: int = 1) -> str:
    """Every map, as bpftrace prints them when it exits; with print(@m, top, div)'s
    `top` (0: all), only the last `top` entries of its order (the largest), and with its
    `div` (0 as 1), values divided (neither for a stats() map, as bpftrace 0.17)."""
    lines: List[str] = []
    div = div or 1
    for data in sorted(maps, key=lambda m: m.name):
        shown = f"@{data.name}"
        if not data.entries:  # as bpftrace prints a map no hit (or delete()) left anything in
            lines.append(f"{shown}: 0" if data.kind in _ZERO_WHEN_EMPTY and not data.keyed
                         else "")
            if data.kind in ("avg", "stats"):  # (its blank line after, as bpftrace 0.17)
                lines.append("")
            continue
        ordered = _ordered(data)
        if top and data.kind != "stats":
            ordered = ordered[-top:]
        for key, value in ordered:
            name = f"{shown}[{_key_text(key)}]" if key else shown
            if data.kind in ("hist", "lhist"):
                lines.append(f"{name}: ")
                lines.extend(_histogram_lines(data, value, div))
                lines.append("")
            elif data.kind == "stats":
                count, total = value
                lines.append(f"{name}: count {count}, average {average(count, total)}, "
                             f"total {total}")
            elif data.kind == "avg":
                lines.append(f"{name}: {_divided(average(*value), div)}")
            else:
                shown_value = _divided(value, div) if isinstance(value, int) else value
                lines.append(f"{name}: {shown_value}")
        if data.kind in ("avg", "stats") and data.entries:
            lines.append("")
    return "".join(line + "\n" for line in lines)


def entries(data: MapData) -> List[Tuple[str, object]]:
    """Each entry of a map: its key as text (its parts comma-separated, "" for a map
    without keys) and its value as `-f json` writes it, in the printed order."""
    return [(_key_text(key, ",") if data.keyed else "", _json_value(data, value))
            for key, value in _ordered(data)]


def json_lines(maps: List[MapData]) -> List[str]:
    """Every map as a line of bpftrace's `-f json` output."""
    out = []
    for data in sorted(maps, key=lambda m: m.name):
        name = f"@{data.name}"
        kind = {"hist": "hist", "lhist": "hist", "avg": "stats", "stats": "stats"}.get(data.kind, "map")
        values = {}
        for key, value in _ordered(data):
            values[_key_text(key, ",")] = _json_value(data, value)
        if not data.entries:
            if data.keyed or data.kind not in _ZERO_WHEN_EMPTY:
                continue
            body = 0
        else:
            body = values.get("") if list(values) == [""] and not any(data.entries) else values
        out.append(json.dumps({"type": kind, "data": {name: body}}))
    return out


def _json_value(data: MapData, value):
    if data.kind == "avg":
        return average(*value)
    if data.kind == "stats":
        count, total = value
        return {"count": count, "average": average(count, total), "total": total}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # (JSON has no NaN or infinity: "nan", "inf", "-inf")
    if data.kind not in ("hist", "lhist"):
        return value
    used = [i for i, count in enumerate(value) if count]
    if not used:
        return []
    buckets = []
    for i in range(used[0], used[-1] + 1):
        low, high = _bucket_bounds(data, i)
        bucket = {}
        if low is not None:
            bucket["min"] = low
        if high is not None:
            bucket["max"] = high
        bucket["count"] = value[i]
        buckets.append(bucket)
    return buckets


def _bucket_bounds(data: MapData, index: int) -> Tuple[Optional[int], Optional[int]]:
    """The smallest and largest value a bucket holds; None where it is open."""
    if data.kind == "hist":
        if index == 0:
            return None, -1
        if index == 1:
            return 0, 0
        return 1 << (index - 2), (1 << (index - 1)) - 1
    low, high, step = data.lhist
    if index == 0:
        return None, low - 1
    if index == (high - low) // step + 1:
        return high, None
    start = low + (index - 1) * step
    return start, start + step - 1
