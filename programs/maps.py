"""The maps of a running program: hash tables in shared memory that the probes update
and the tracer reads (docs/programs.md, "Maps").

    area:  u64 magic, u64 run (trampolines/program_file.py), u64 faults (memory reads
           that found nothing to read: str() and pointer reads of bad addresses),
           u64 maps, u64 offset of each map's table, u64 bytes of the maps'
           description, the description: the shapes as JSON (a reader that has only
           the file, as `stat` of a program built into the probes, reads it by them)
    table: u64 capacity (a power of two), key words, value words, entry words,
           u64 dropped (updates a full table could not take), 3 words 0,
           then `capacity` entries
    entry: u64 state: 0 free, 2 being claimed, else (hash | 1): its key is written
           u64 present: 1 once updated, 0 again after delete()
           key words (an integer key is a word, a float's or double's its bits, a string
           key 8; `probe` where every key at that place is `probe` (or every one
           `func`), a word: the index of that name in the shape's names), value words (a
           string value, @m[k] = str(...), 8; a float or double, its bits)

A lookup starts at the key's first slot (first_slot) and looks at the entries after
it in turn, wrapping. A probe claims a free entry with a compare-and-swap of its state
from 0 to 2, writes the key, then stores the hash with bit 0 set (entry_state); one
that finds state 2 waits for that store. Values are updated with atomic adds (count,
sum, avg, hist, lhist) or compare-and-swap loops (min, max); a plain assignment is a
store. min() and max() start from the largest and the smallest value, written when
the entry is claimed.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from urewrite.programs import floats
from urewrite.programs.checks import INT, STR, Checked
from urewrite.programs.output import HIST_BUCKETS, MapData
from urewrite.trampolines.program_file import MAPS_MAGIC

MAGIC = MAPS_MAGIC
HASH_MULTIPLIER = 0x9E3779B97F4A7C15
HEAD_WORDS = 4  # of the area, before the tables' offsets
FAULTS = 16  # the area's count of memory reads that found nothing to read
HEADER_WORDS = 8  # of a table
TABLE_DROPPED = 32  # a table's count of the updates it could not take
ENTRY_HEAD = 2  # state, present
STRING_WORDS = 8
NAME = "name"  # a key type: `probe`'s or `func`'s value, kept as its index (a word, not 64 bytes)
AGGREGATIONS = ("count", "sum", "min", "max", "avg", "stats", "hist", "lhist")
KEYED_CAPACITY = 4096  # entries of a map with keys, as bpftrace's default
INT64_MAX, INT64_MIN = (1 << 63) - 1, 1 << 63  # (INT64_MIN as a word)


@dataclass(frozen=True)
class MapShape:
    name: str
    kind: str
    key_types: Tuple[str, ...]
    value_words: int
    capacity: int
    signed: bool
    lhist: Optional[Tuple[int, int, int]] = None
    names: Tuple[str, ...] = ()  # what a NAME key's index names
    value_type: str = INT  # a plain value's: INT, STR, or floats.F32 or F64 (its bits)

    @property
    def key_words(self) -> int:
        return sum(STRING_WORDS if t == STR else 1 for t in self.key_types)

    @property
    def entry_words(self) -> int:
        return ENTRY_HEAD + self.key_words + self.value_words

    @property
    def holds_strings(self) -> bool:
        """A map of strings (@m[k] = str(...)): its value is a string's 64 bytes."""
        return self.kind == "value" and self.value_words == STRING_WORDS

    @property
    def initial(self) -> Optional[int]:
        """The value word a claimed entry starts from, where it is not 0."""
        return {"min": INT64_MAX, "max": INT64_MIN}.get(self.kind)

    def table_bytes(self) -> int:
        return 8 * (HEADER_WORDS + self.capacity * self.entry_words)


def entry_state(words) -> int:
    """A claimed entry's state for these key words: their hash, bit 0 set."""
    h = HASH_MULTIPLIER
    for word in words:
        h = ((h ^ word) * HASH_MULTIPLIER) % 2**64
    return (h ^ h >> 29) | 1


def first_slot(words, capacity: int) -> int:
    """The entry a lookup of these key words looks at first. One word: the top
    log2(capacity) bits of the word times HASH_MULTIPLIER, one multiply from the key to
    the entry's address (a probe's store to the entry waits on that address: about
    1 ns a lookup less than the hash's six steps, section 10 of docs/benchmarks.md);
    more: the state's low bits."""
    if len(words) == 1:
        bits = capacity.bit_length() - 1
        return (words[0] * HASH_MULTIPLIER) % 2**64 >> (64 - bits) if bits else 0
    return entry_state(words) & (capacity - 1)


def shapes(checked: Checked, capacity: int = KEYED_CAPACITY,
           name_keys: Dict[str, Dict[int, str]] = None) -> List[MapShape]:
    """Each map's shape; `capacity`: the entries of a map with keys (a power of two
    is taken at or above it); `name_keys`: by map, the places of its keys that are
    always `probe` or always `func` (of type NAME: their names are the lowering's to
    fill in)."""
    name_keys = name_keys or {}
    capacity = 1 << max(capacity - 1, 1).bit_length()
    out = []
    for name, info in checked.maps.items():
        if info.kind == "hist":
            words = HIST_BUCKETS
        elif info.kind == "lhist":
            low, high, step = info.lhist
            words = (high - low) // step + 2
        elif info.kind in ("avg", "stats"):
            words = 2  # count, total
        elif info.kind == "value" and info.value == STR:
            words = STRING_WORDS  # a string's 64 bytes
        else:
            words = 1
        keys = tuple(NAME if k in name_keys.get(name, {}) else t
                     for k, t in enumerate(info.keys))
        out.append(MapShape(name, info.kind, keys, words,
                            capacity if info.keys else 1, info.signed, info.lhist,
                            value_type=info.value if info.kind == "value" else INT))
    return out


def describe(maps: List[MapShape]) -> bytes:
    """The maps' shapes, as the area's head carries them (JSON, padded to 8 bytes)."""
    text = json.dumps([{"name": m.name, "kind": m.kind, "keys": list(m.key_types),
                        "value_words": m.value_words, "capacity": m.capacity,
                        "signed": m.signed, "lhist": m.lhist, "names": list(m.names),
                        **({"value": m.value_type} if m.value_type in floats.FLOATS else {})}
                       for m in maps],
                      separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def shapes_of(area) -> List[MapShape]:
    """The shapes an area's head describes; ValueError if it is not a maps area."""
    try:
        magic, _, _, count = struct.unpack_from("<4Q", area, 0)
        at = 8 * (HEAD_WORDS + count)
        size, = struct.unpack_from("<Q", area, at)
        if magic != MAGIC or count > 4096 or size > len(area):
            raise ValueError("not a maps area")
        found = [MapShape(d["name"], d["kind"], tuple(d["keys"]), int(d["value_words"]),
                          int(d["capacity"]), bool(d["signed"]),
                          tuple(d["lhist"]) if d["lhist"] else None,
                          tuple(str(n) for n in d.get("names", ())),
                          STR if int(d["value_words"]) == STRING_WORDS and d["kind"] == "value"
                          else str(d.get("value", INT)))
                 for d in json.loads(bytes(area[at + 8:at + 8 + size]))]
    except (struct.error, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"not a maps area: {e}")
    if len(found) != count or any(m.kind not in AGGREGATIONS + ("value",) or
                                  m.value_type not in (INT, STR) + floats.FLOATS or
                                  m.capacity & (m.capacity - 1) for m in found):
        raise ValueError("not a maps area")
    return found


def layout(maps: List[MapShape]) -> Tuple[List[int], int]:
    """Each table's offset in the area, and the area's size."""
    offset = _align(head_bytes(maps))
    offsets = []
    for shape in maps:
        offsets.append(offset)
        offset = _align(offset + shape.table_bytes())
    return offsets, offset


def initial_area(maps: List[MapShape], run: int = 0) -> bytearray:
    offsets, size = layout(maps)
    area = bytearray(size)
    struct.pack_into(f"<4Q{len(maps)}Q", area, 0, MAGIC, run, 0, len(maps), *offsets)
    description = describe(maps)
    at = 8 * (HEAD_WORDS + len(maps))
    struct.pack_into("<Q", area, at, len(description))
    area[at + 8:at + 8 + len(description)] = description
    for shape, offset in zip(maps, offsets):
        struct.pack_into("<4Q", area, offset, shape.capacity, shape.key_words,
                         shape.value_words, shape.entry_words)
    return area


def head_bytes(maps: List[MapShape]) -> int:
    """The area's head: what a maps file needs written beyond zeros for the code (the
    tables' headers are the tracer's: read() goes by the shapes)."""
    return 8 * (HEAD_WORDS + len(maps) + 1) + len(describe(maps))


def run_of(area) -> int:
    return struct.unpack_from("<Q", area, 8)[0]


def read(area, maps: List[MapShape]) -> Tuple[List[MapData], int]:
    """The maps' contents, as the printer takes them, and the updates full tables
    dropped. The layout is the shapes': only magic, count and offsets are read from the
    area, and must be theirs (a user's own maps file is not the tracer's to trust)."""
    view = memoryview(area)
    offsets, size = layout(maps)
    if len(view) < size:
        raise ValueError("not this program's maps")
    magic, _, _, count = struct.unpack_from("<4Q", view, 0)
    if magic != MAGIC or count != len(maps) or \
            list(struct.unpack_from(f"<{count}Q", view, 8 * HEAD_WORDS)) != offsets:
        raise ValueError("not this program's maps")
    out, dropped = [], 0
    for shape, offset in zip(maps, offsets):
        capacity, entry_words = shape.capacity, shape.entry_words
        lost, = struct.unpack_from("<Q", view, offset + TABLE_DROPPED)
        dropped += lost
        data = MapData(shape.name, shape.kind, lhist=shape.lhist, keyed=bool(shape.key_types))
        words = struct.unpack_from(f"<{capacity * entry_words}Q", view, offset + 8 * HEADER_WORDS)
        for i in range(capacity):
            entry = words[i * entry_words:(i + 1) * entry_words]
            if not entry[0] & 1 or entry[1] != 1:
                continue
            key, at = [], ENTRY_HEAD
            for kind in shape.key_types:
                if kind == STR:
                    raw = struct.pack(f"<{STRING_WORDS}Q", *entry[at:at + STRING_WORDS])
                    key.append(raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
                    at += STRING_WORDS
                elif kind == NAME:
                    names = shape.names
                    key.append(names[entry[at]] if entry[at] < len(names) else "")
                    at += 1
                elif kind in floats.FLOATS:
                    key.append(floats.shown(floats.from_bits(entry[at], kind)))
                    at += 1
                else:
                    key.append(_signed(entry[at]))
                    at += 1
            data.entries[tuple(key)] = _value(shape, entry[at:at + shape.value_words])
        out.append(data)
    return out, dropped


def _value(shape: MapShape, words):
    if shape.holds_strings:
        raw = struct.pack(f"<{STRING_WORDS}Q", *words)
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    if shape.value_type in floats.FLOATS:
        return floats.shown(floats.from_bits(words[0], shape.value_type))
    if shape.kind in ("hist", "lhist"):
        return list(words)
    if shape.kind in ("avg", "stats"):
        return words[0], _signed(words[1])
    if shape.kind == "count" or not shape.signed and shape.kind in ("sum", "value"):
        return words[0]
    return _signed(words[0])


def _signed(word: int) -> int:
    return word - (1 << 64) if word >> 63 else word


def _align(n: int) -> int:
    return (n + 63) & ~63


def merge(contents: List[List[MapData]]) -> List[MapData]:
    """One program's maps from several processes (each armed live has its own), as one
    set: counts, sums, averages and buckets add up; min and max keep theirs; a plain
    value keeps the last process's."""
    merged = {}
    for maps in contents:
        for data in maps:
            into = merged.setdefault(data.name, MapData(data.name, data.kind, lhist=data.lhist,
                                                        keyed=data.keyed))
            for key, value in data.entries.items():
                if key not in into.entries:
                    into.entries[key] = value
                elif data.kind in ("hist", "lhist"):
                    into.entries[key] = [a + b for a, b in zip(into.entries[key], value)]
                elif data.kind in ("avg", "stats"):
                    into.entries[key] = tuple(a + b for a, b in zip(into.entries[key], value))
                elif data.kind in ("count", "sum"):
                    into.entries[key] += value
                elif data.kind in ("min", "max"):
                    into.entries[key] = (min if data.kind == "min" else max)(into.entries[key], value)
                else:
                    into.entries[key] = value
    return list(merged.values())


def reset(area, maps: List[MapShape], index: int, forget: bool) -> None:
    """clear(@m) (`forget`: its keys are gone, as delete() leaves each) or zero(@m) (its
    keys stay, their values 0: a min() map's too, as bpftrace's) on a writable area, as
    the tracer does them while the processes run (an update racing with it lands on
    either side of it, as bpftrace's)."""
    offsets, size = layout(maps)
    if len(area) < size:
        raise ValueError("not this program's maps")
    shape, offset = maps[index], offsets[index]
    initial = [shape.initial or 0 if forget else 0] + [0] * (shape.value_words - 1)
    value_at = ENTRY_HEAD + shape.key_words
    for i in range(shape.capacity):
        entry = offset + 8 * (HEADER_WORDS + i * shape.entry_words)
        state, present = struct.unpack_from("<QQ", area, entry)
        if not state & 1 or present != 1:
            continue
        if forget:
            struct.pack_into("<Q", area, entry + 8, 0)
        struct.pack_into(f"<{shape.value_words}Q", area, entry + 8 * value_at, *initial)


def faults(area) -> int:
    """Memory reads of the program that found nothing to read."""
    return struct.unpack_from("<Q", area, FAULTS)[0]
