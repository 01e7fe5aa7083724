"""Reads region files once their writers are done: fast, and safe on files of other users.

Under `urewrite stat` run as root, processes that switched to another user write their
regions into a directory that any user may write to (reader/directories.py), so a file there
is not trusted: it is opened without following a symlink and without blocking (a
FIFO), must be a regular file, and every size in its header is checked against the
file before anything is read. Files are read with pread, not mapped: a writer that
truncates its file under a mapping would kill the reader with SIGBUS.

Speed: a region of every function of python3.11 has 17,000 probes and 257 counter rows
of 4.5 MB, nearly all holes. Only the rows in use are read, and of those only the
pages that hold data (SEEK_DATA). The probe table and names are the same for every
process of one rewrite: they are parsed once per run (`TableCache`) and compared byte
for byte for each further file (by `stat`, while its command runs). Rows of latency
histograms (megabytes) are added up by numpy; short rows (counters only) in Python
(`ListSums`): loading numpy takes 0.1 s of CPU, a quarter of a loop of 40 short runs of
python3.11, whose 40 rows of 10,000 counters Python adds up in a few ms.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
from array import array
from itertools import accumulate, repeat
from operator import add
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from urewrite.trampolines import region as R

# Limits on what a header may ask us to read: far above any rewrite (node has 160,000
# probes), far below what would exhaust memory.
MAX_PROBES = 1 << 24
MAX_TABLE_BYTES = 1 << 28  # probe table and names (a big C++ library: tens of MB)
MAX_SLOTS = 1 << 12

_NOT_REGION = "not a urewrite region (or one still being set up)"

# Rows of at least this many words are added up by numpy (loaded then), shorter ones in
# Python (0.05 us a word word by word, less packed: ListSums), against numpy's load of 0.1 s.
NUMPY_WORDS = 1 << 16


def _little_endian(typecode: str, data) -> array:
    """The little-endian words of `data` (whose length is a multiple of their size)."""
    words = array(typecode)
    words.frombytes(data)  # (array(typecode, data) reads a memoryview as ints, byte by byte)
    if sys.byteorder != "little":
        words.byteswap()
    return words


def open_region_file(path: str) -> int:
    """A read-only descriptor on `path`; RegionError when it is a symlink, a FIFO, a
    device or anything but a regular file with a single name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:  # (ELOOP: a symlink)
        raise R.RegionError(f"{path}: {e.strerror}")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise R.RegionError(f"{path}: not a region file (not a regular file with one name)")
    return fd


def _pread_exact(fd: int, size: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:  # truncated since we checked its size
        raise R.RegionError(f"{path}: truncated or inconsistent region")
    return data


class Header(NamedTuple):
    """The header fields a reader needs, checked against the file's size. (NamedTuples
    here, not dataclasses: made at import, 3 dataclasses took 7 ms of stat's CPU.)"""
    count: int
    slots: int
    probes_off: int
    strings_off: int
    owners_off: int
    counters_off: int
    stride: int
    pid: int
    machine: int
    load_bias: int
    build_id: str
    object: str
    latency_count: int
    returns_missed: int
    latency_missed: int
    template_key: tuple  # the fields that come from the rewrite's template
    timed: bool = False  # latency was asked for: the histograms hold calls' durations

    @property
    def row_words(self) -> int:
        return self.count + R.LATENCY_BUCKETS * self.latency_count

    @property
    def words_in_use(self) -> int:
        """A row's words that hold data: the histograms only where calls were timed."""
        return self.row_words if self.timed else self.count


def read_header(fd: int, path: str, file_size: int) -> Header:
    if file_size < R.HEADER_SIZE:
        raise R.RegionError(f"{path}: {_NOT_REGION}")
    raw = _pread_exact(fd, R.HEADER_SIZE, 0, path)
    if raw[:8] != R.MAGIC:
        raise R.RegionError(f"{path}: {_NOT_REGION}")
    (_, version, _, size, count, slots, probes_off, strings_off, owners_off, counters_off,
     stride, pid, machine, bias, bid_size, _, bid, obj, *_rest) = R._HEADER.unpack_from(raw)
    if version != R.VERSION:
        raise R.RegionError(f"{path}: region version {version}, this reader knows {R.VERSION}")
    latency_count, = struct.unpack_from("<I", raw, R.OFF_LATENCY_COUNT)
    returns_missed, = struct.unpack_from("<Q", raw, R.OFF_RETURNS_MISSED)
    latency_missed, = struct.unpack_from("<Q", raw, R.OFF_LATENCY_MISSED)
    timed = R.timed(raw)
    if size > file_size or count > MAX_PROBES or slots > MAX_SLOTS \
            or latency_count > min(count, R.MAX_HISTOGRAMS) \
            or not probes_off >= R.HEADER_SIZE \
            or probes_off + count * R.PROBE_ENTRY_SIZE > strings_off \
            or strings_off > owners_off or owners_off - probes_off > MAX_TABLE_BYTES \
            or owners_off % 8 or owners_off + slots * R.OWNER_ENTRY_SIZE > counters_off \
            or counters_off % 8 or stride % 8 or R.row_bytes(count, latency_count) > stride \
            or counters_off + (slots + 1) * stride > file_size:
        raise R.RegionError(f"{path}: truncated or inconsistent region")
    key = (count, slots, probes_off, strings_off, owners_off, counters_off, stride, machine,
           bid_size, bid, obj, latency_count)
    return Header(count, slots, probes_off, strings_off, owners_off, counters_off, stride,
                  pid, machine, bias, bid[:min(bid_size, 32)].hex(),
                  obj.split(b"\0")[0].decode(errors="replace"), latency_count,
                  returns_missed, latency_missed, key, timed)


class ProbeTable(NamedTuple):
    """The probes of one rewrite, as its template lists them."""
    names: Tuple[str, ...]
    kinds: Tuple[str, ...]
    addresses: Tuple[int, ...]
    histograms: Tuple[int, ...]  # index of each probe's latency histogram, -1 when none


def _name_at(block: bytes, offset: int) -> Optional[str]:
    """The NUL-terminated name at `offset` of the names block; None when it runs off
    the end (or starts past it)."""
    end = block.find(b"\0", offset)
    if end < 0 or offset > len(block):
        return None
    return block[offset:end].decode(errors="replace")


def _names(block: bytes, offsets: List[int]) -> list:
    """The names at `offsets` (None for one that runs off the end). The rewriter lays
    them out one after the other: split at the NULs once and look each offset up (a
    python3.11 of every function: 17,000 names, 20 ms one by one); an offset inside a
    name (a shared suffix) is read on its own."""
    pieces = block.split(b"\0")[:-1]  # (the last piece has no NUL after it)
    text = block.decode(errors="replace").split("\0")[:-1] if block.isascii() else \
        [p.decode(errors="replace") for p in pieces]
    index = {start: i for i, start in enumerate(accumulate((len(p) + 1 for p in pieces[:-1]),
                                                           initial=0))} if pieces else {}
    return [text[index[o]] if o in index else _name_at(block, o) for o in offsets]


def parse_table(blob: bytes, header: Header, path: str) -> ProbeTable:
    """The probe table and names (`blob`: the file from probes_off to owners_off)."""
    count = header.count
    table = blob[:count * R.PROBE_ENTRY_SIZE]
    halves = _little_endian("I", table)  # {u64 address, u32 kind, u32 name} each
    kind_fields, name_offsets = halves[2::4], halves[3::4]
    names = _names(blob[header.strings_off - header.probes_off:], name_offsets.tolist())
    histograms = [(kind >> 16) - 1 for kind in kind_fields]
    # the first probe with a name that runs off the end, or a histogram past the last
    bad_name = names.index(None) if None in names else count
    bad_histogram = next((i for i, h in enumerate(histograms) if h >= header.latency_count),
                         count) if histograms and max(histograms) >= header.latency_count \
        else count
    if bad_name < bad_histogram:
        raise R.RegionError(f"{path}: truncated or inconsistent region")
    if bad_histogram < count:
        raise R.RegionError(f"{path}: probe {names[bad_histogram]} names a missing histogram")
    kind_names = {}
    kinds = []
    for kind in kind_fields:
        kind &= R.KIND_MASK
        name = kind_names.get(kind)
        if name is None:
            name = kind_names[kind] = R.KIND_NAMES.get(kind, str(kind))
        kinds.append(name)
    return ProbeTable(tuple(names), tuple(kinds), tuple(_little_endian("Q", table)[0::2]),
                      tuple(histograms))


class TableCache:
    """Probe tables already parsed in this run, by template: a further file of the same
    rewrite costs a byte comparison, not a parse. (And the run's scratch buffer.)"""

    def __init__(self):
        self.by_template: Dict[tuple, List[Tuple[bytes, ProbeTable]]] = {}
        self._derived: Dict[tuple, object] = {}
        self._compared: Dict[tuple, Tuple[tuple, ProbeTable]] = {}  # file -> its table
        self.parsed: List[Tuple[str, ProbeTable]] = []  # (object, table), as parsed
        self.scratch = Scratch()

    def derived(self, table: ProbeTable, what: str, make: Callable[[], object]):
        """Something a reader makes from a probe table, made once per table."""
        key = (id(table), what)
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def prepare(self, path: str) -> bool:
        """Parses the probe table of `path` now if its rewrite has none parsed yet
        (while its command still runs: a python3.11 of every function takes 4 ms), else
        compares it with the parsed one now (0.2 ms a file, not after the run).
        False while the file may still be being set up (try again later); True once
        there is nothing more to do now, its table known or not readable (the reading
        after the run says why)."""
        try:
            fd = open_region_file(path)
        except (OSError, R.RegionError):
            return False
        try:
            header = read_header(fd, path, os.fstat(fd).st_size)
            if header.pid == 0:  # (the runtime sets it once the table is in)
                return False
        except (OSError, R.RegionError):
            os.close(fd)
            return False
        try:
            first = header.template_key not in self.by_template
            self.table(fd, header, path)
            if first and header.words_in_use >= NUMPY_WORDS:
                __import__("numpy")  # (sums_for's: its 60 ms now, not after the run)
        except (OSError, R.RegionError):
            pass  # (a table read in vain is not read again: it may be 256 MB)
        finally:
            os.close(fd)
        return True

    def table(self, fd: int, header: Header, path: str) -> ProbeTable:
        """The probe table of the region open on `fd`. A file compared already (by
        prepare, while its command ran) is not read again: its process wrote the table
        before its pid and never writes it after. Another file (a new inode, or one
        reused by a file of another size, template or pid) is read again; not its
        times, which every write of a counter through the mapping moves."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_size)
        compared = self._compared.get(identity)
        if compared is not None and compared[0] == (header.template_key, header.pid):
            return compared[1]
        blob = _pread_exact(fd, header.owners_off - header.probes_off, header.probes_off, path)
        known = self.by_template.setdefault(header.template_key, [])
        for seen, table in known:
            if seen == blob:
                break
        else:
            table = parse_table(blob, header, path)
            known.append((blob, table))
            self.parsed.append((header.object, table))
        self._compared[identity] = ((header.template_key, header.pid), table)
        return table


def _data_runs(fd: int, start: int, end: int):
    """(from, to) of the parts of [start, end) that hold data: a sparse file's holes
    read as zeros and are skipped (file systems without SEEK_DATA report it all)."""
    at = start
    while at < end:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:  # ENXIO: no data from here on
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        at = hole


class Sums:
    """Counter rows added up word by word, exactly: numpy's u64 sums, with a count of
    the times each word wrapped (rows of other users' files may hold anything)."""

    def __init__(self, words: int):
        import numpy as np  # (loaded for long rows only: see NUMPY_WORDS)
        self._np = np
        self.low = np.zeros(words, dtype=np.uint64)
        self.wraps = None  # (a numpy array once a word wrapped)
        self.bound = 0  # above every word of `low` (as long as no word wrapped)

    def add(self, first: int, values) -> None:
        """Adds `values` (a numpy array of u64) to the words from `first` on."""
        np = self._np
        top = int(values.max()) if len(values) else 0
        part = self.low[first:first + len(values)]
        np.add(part, values, out=part)
        self.bound += top
        # Nothing can have wrapped while the bound is below 2^63 (live counters may grow
        # between the two reads of `values`, never by 2^63): skip the costlier check.
        if self.bound < 1 << 63:
            return
        wrapped = part < values  # (an unsigned sum that wrapped is below either term)
        if wrapped.any():
            if self.wraps is None:
                self.wraps = np.zeros(len(self.low), dtype=np.uint64)
            self.wraps[first:first + len(values)] += wrapped

    def add_bytes(self, first: int, data: memoryview) -> None:
        """Adds the little-endian u64 words of `data`."""
        self.add(first, self._np.frombuffer(data, dtype="<u8"))

    def values(self, words: Optional[int] = None) -> List[int]:
        """The first `words` sums (all of them without)."""
        out = self.low[:words].tolist()
        if self.wraps is not None:
            for i in self._np.flatnonzero(self.wraps[:words]).tolist():
                out[i] += int(self.wraps[i]) << 64
        return out


class ListSums:
    """Sums as Python integers (exact, never wrap): for rows too short to be worth
    loading numpy.

    A row whose words are all below 2^56 (a real process's counts) is added as one
    integer, base 2^64, at C speed: 255 of them cannot carry from a word into the next
    (255 x 2^56 < 2^64); then that integer is split into the list. Other rows are
    added word by word."""

    PACKED_ROWS = 255

    def __init__(self, words: int):
        self.low = [0] * words
        self._packed, self._rows = 0, 0

    def add_bytes(self, first: int, data: memoryview) -> None:
        self._grow(first + len(data) // 8)
        if bytes(data[7::8]).count(0) == len(data) // 8:  # (each word's top byte is 0)
            self._packed += int.from_bytes(data, "little") << (64 * first)
            self._rows += 1
            if self._rows == self.PACKED_ROWS:
                self._unpack()
            return
        values = _little_endian("Q", data)
        end = first + len(values)
        self.low[first:end] = map(add, self.low[first:end], values)

    def _unpack(self) -> None:
        if self._rows:
            words = _little_endian("Q", self._packed.to_bytes(8 * len(self.low), "little"))
            self.low = list(map(add, self.low, words))
            self._packed, self._rows = 0, 0

    def values(self, words: Optional[int] = None) -> List[int]:
        self._grow(words or 0)
        self._unpack()
        return self.low[:words]

    def _grow(self, words: int) -> None:
        if words > len(self.low):
            self._unpack()
            self.low += [0] * (words - len(self.low))


def sums_for(header: Header):
    """Sums for the rows of `header`'s regions: numpy's where a region's words in use
    are many (its histograms where calls were timed), else Python's, which grow where
    a later region of the same table was timed (whose histograms are then added in
    Python: slower, as right)."""
    if header.words_in_use >= NUMPY_WORDS:
        return Sums(header.row_words)
    return ListSums(header.words_in_use)


class Scratch:
    """A buffer reused from one file to the next: reading megabytes of counters into
    fresh memory would fault in every page of it each time."""

    def __init__(self):
        self._buffer = memoryview(bytearray())

    def get(self, size: int) -> memoryview:
        if len(self._buffer) < size:
            self._buffer = memoryview(bytearray(size))
        return self._buffer[:size]


def read_counts(fd: int, header: Header, path: str, scratch: Scratch) -> Tuple[list, int]:
    """The data of the counter rows in use and of the shared row, as (first word,
    bytes) runs (valid until `scratch` is used again); and the number of per-thread
    rows in use (docs/region.md: a free slot's row was never written)."""
    owners = _little_endian("Q", _pread_exact(fd, header.slots * R.OWNER_ENTRY_SIZE,
                                              header.owners_off, path))
    claimed = [slot for slot, owner in enumerate(owners[::R.OWNER_ENTRY_SIZE // 8]) if owner]
    row_bytes = 8 * header.words_in_use
    wanted = []  # (row's first byte, from, to)
    for slot in claimed + [header.slots]:
        row = header.counters_off + slot * header.stride
        wanted += [(row, start, end) for start, end in _data_runs(fd, row, row + row_bytes)]
    buffer = scratch.get(sum(end - start for _, start, end in wanted))
    runs, at = [], 0
    for row, start, end in wanted:
        part = buffer[at:at + end - start]
        if os.preadv(fd, [part], start) != end - start:
            raise R.RegionError(f"{path}: truncated or inconsistent region")
        runs.append(((start - row) // 8, part))
        at += end - start
    return runs, len(claimed)


class RegionCounts(NamedTuple):
    """One region file read: its header, probe table and summed counters."""
    path: str
    header: Header
    table: ProbeTable
    sums: object  # Sums or ListSums
    threads: int


def read_counts_of(path: str, tables: TableCache,
                   shared: Optional[Dict[int, object]] = None) -> RegionCounts:
    """Reads a region. With `shared` (id of a probe table -> sums), its counters are
    added to the sums of the regions of the same probe table read before it, once the
    whole file has been read; the first such region's sums are put there."""
    try:
        fd = open_region_file(path)
    except FileNotFoundError:
        raise R.RegionError(f"{path}: no such file (removed?)")
    try:
        header = read_header(fd, path, os.fstat(fd).st_size)
        table = tables.table(fd, header, path)
        runs, threads = read_counts(fd, header, path, tables.scratch)
    finally:
        os.close(fd)
    sums = None if shared is None else shared.get(id(table))
    if sums is None:
        sums = sums_for(header)
        if shared is not None:
            shared[id(table)] = sums
    for first, data in runs:
        sums.add_bytes(first, data)
    return RegionCounts(path, header, table, sums, threads)


def to_region(counts: RegionCounts, with_probes: bool = True,
              timed: Optional[bool] = None, probes_later: bool = False) -> R.Region:
    """`timed`: whether the counts hold histograms of timed calls (the header's flag, or
    for sums over several regions, whether any of them was timed). `probes_later`: a
    region without histograms gets its hits and table, its probes only from
    probes_made (20,000 of them take 5 ms)."""
    h, table = counts.header, counts.table
    timed = h.timed if timed is None else timed
    region = R.Region(counts.path, h.pid, h.object, h.build_id, h.load_bias, h.machine,
                      threads=counts.threads, returns_missed=h.returns_missed,
                      latency_missed=h.latency_missed, timed=h.timed)
    if not with_probes:
        return region
    region.table = table
    if probes_later and not (h.latency_count and timed):
        region.hits = counts.sums.values(h.count)
        return region
    values = counts.sums.values(h.row_words if timed else h.count)
    buckets = R.LATENCY_BUCKETS
    first = h.count  # (histogram k: the words from first + buckets * k on)
    histograms = [None if k < 0 else values[first + buckets * k:first + buckets * (k + 1)]
                  for k in table.histograms] if h.latency_count and timed else repeat(None)
    # (map, not a loop: 10,000 probes of a process each time stat reports)
    region.probes = list(map(R.ProbeCount, table.names, table.kinds, table.addresses,
                             values[:h.count], histograms))
    return region


def probes_made(region: R.Region) -> R.Region:
    """`region` with its probes, where to_region left them to be made."""
    if region.hits is not None:
        t = region.table
        region.probes = list(map(R.ProbeCount, t.names, t.kinds, t.addresses, region.hits))
        region.hits = None
    return region


def region_paths(directory: str) -> List[str]:
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))
            if n.endswith(R.FILE_SUFFIX)]


def collect(directory: str, problems: Optional[List[str]] = None,
            tables: Optional[TableCache] = None, probes_later: bool = False) -> List[R.Region]:
    return collect_paths(region_paths(directory), problems, tables, probes_later)


def collect_paths(paths: List[str], problems: Optional[List[str]] = None,
                  tables: Optional[TableCache] = None,
                  probes_later: bool = False) -> List[R.Region]:
    """The regions of these files as `read_regions` gives them, except that the hits
    (and histograms) of regions with the same probe table are added up in the first of
    them; the others keep their pid, object, threads and returns_missed, with no
    probes. Totals per probe are `read_regions`' in the same order, for the cost of
    reading each further process's counts. `tables`: probe tables parsed already
    (`TableCache.prepare`). `probes_later`: as to_region's."""
    tables = tables or TableCache()
    read: List[Tuple[RegionCounts, bool]] = []  # (region, whether it shows the sums)
    shared: Dict[int, object] = {}
    shown = set()  # ids of the probe tables whose sums a region shows already
    timed = set()  # ids of the probe tables with a region of timed calls
    for path in paths:
        try:
            counts = read_counts_of(path, tables, shared)
        except R.RegionError as e:
            if problems is None:
                raise
            problems.append(str(e))
            continue
        read.append((counts, id(counts.table) not in shown))
        shown.add(id(counts.table))
        if counts.header.timed:
            timed.add(id(counts.table))
    return [to_region(counts, lead, id(counts.table) in timed, probes_later)
            for counts, lead in read]
