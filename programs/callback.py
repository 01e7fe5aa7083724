"""C callbacks: a C function that every probe of a file runs (`--call FILE.c:FUNCTION`,
at a rewrite or with `urewrite run`), built as a probe program's file
(trampolines/program_file.py), so that the runtime maps and calls it as it does a
program's code: `void FUNCTION(struct urewrite_context *ctx)` (trampolines/urewrite.h).

The C file is compiled with the machine's C compiler (or taken as an object file) and
linked by it into a small shared object, which is then laid flat: its loadable bytes
from address 0, so that the code's PC-relative references hold wherever the file is
mapped (at a page boundary: arm64's adrp counts pages). What makes it run safely where
a probe runs it is checked here: no writable data (the code is mapped read and
execute), nothing to relocate at load, no library call, no floating-point or vector
register (the probe saves the general ones only: the backend's callback_refusal), a
bounded stack. Each probe gets a stub of its own that fills in the context's probe,
kind, name and area, then jumps to the function (the backend's callback_stubs).

The maps a callback declares (UREWRITE_MAP) are a probe program's maps
(programs/maps.py): the tracer reads and prints them as it prints a program's. Each
probe's own area (--call-area bytes) follows the maps' tables in the maps file.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from urewrite.errors import UrewriteError
from urewrite.programs import maps as M
from urewrite.programs.checks import INT
from urewrite.trampolines import program_file

STACK_LIMIT = 2048  # bytes of stack a callback may take (urewrite.h's UREWRITE_CALLBACK_STACK)
DEFAULT_AREA = 64
MAP_SECTION, READS_SECTION = ".urewrite_maps", ".urewrite_reads"
MAP_MAGIC = 0x3150414D45525531  # struct urewrite_map's first word
MAP_RECORD = struct.Struct("<QIIqqq32sQQQ")  # struct urewrite_map
MAP_FILLED = 72  # where the fields urewrite fills in start: table, capacity, entry_words
RUN = "--call"  # what a target's `runs` says runs at its probes
KINDS = {1: "count", 2: "sum", 3: "min", 4: "max", 5: "avg", 6: "hist", 7: "lhist"}
MAX_KEYS = 4
# sections a callback may have that are writable in the linked object but never written
# by its code (the dynamic section, empty GOTs, the maps' declarations)
READ_ONLY_AT_RUN = {".dynamic", ".got", ".got.plt", MAP_SECTION}
HEADER_DIR = os.path.join(os.path.dirname(program_file.__file__))  # urewrite.h's


class CallbackError(UrewriteError):
    """A callback that cannot be built or would not run safely: one line that says why."""


@dataclass
class Callback:
    """A built callback, in the form attach.write_files and attach.program_blob take a
    lowered program: `code` has one entry per probe it runs at (filled in by attach())."""
    label: str  # FILE:FUNCTION, as given
    backend: object  # the machine's (arch/): it writes the stubs
    blob: bytes  # the linked code, flat from address 0
    function: int  # the callback's offset in it
    map_records: List[int]  # each declared map's struct urewrite_map, by offset in blob
    maps: List[M.MapShape]
    uses: int
    area: int  # bytes of each probe's own area
    code: Dict[str, tuple] = field(default_factory=dict)  # key -> (number, kind, name,
    # area offset in the maps file)
    printfs: list = field(default_factory=list)  # (none: events are words, emitted)
    areas_end: int = 0  # where the probes' areas end in the maps file

    read: int = program_file.ARGUMENTS  # the arguments it reads (UREWRITE_ARGS)
    filled: int = program_file.ARGUMENTS  # those the runtime fills in: as many as it reads
    # and the probes record at most (attach()); the stubs zero the rest

    @property
    def arguments(self) -> int:
        return self.filled

    def called_at(self, stub: int) -> int:
        """What a probe's direct entry calls, its stub at `stub`: the function itself
        where the stubs fill in nothing (a call less a hit, and every probe's entry the
        same one), else the stub. (The runtime's trace path calls the stub: on arm64 its
        `bti c` takes a call through a register.)"""
        fills = self.filled < self.read or \
            self.uses & (program_file.USES_PROBE | program_file.USES_AREA)
        return stub if fills else self.function

    def maps_bytes(self) -> int:
        return max(M.layout(self.maps)[1], self.areas_end)

    def initial_maps(self, run: int) -> bytes:
        area = M.initial_area(self.maps, run)
        return bytes(area) + bytes(self.maps_bytes() - len(area))


def parse_spec(spec: str) -> Tuple[str, str]:
    """FILE.c:FUNCTION (or FILE.o:FUNCTION) -> (file, function)."""
    path, _, function = spec.rpartition(":")
    if not path or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", function):
        raise CallbackError(f"--call {spec}: give FILE.c:FUNCTION (or FILE.o:FUNCTION)")
    if not os.path.isfile(path):
        raise CallbackError(f"--call {spec}: no file {path}")
    return path, function


def build(spec: str, backend, area: int = DEFAULT_AREA,
          map_size: int = M.KEYED_CAPACITY) -> Callback:
    """The callback `spec` names, built for files of `backend`'s machine (arch/: its
    compiler flags, checks and stubs): a CallbackError with one line where it cannot be
    built or would not run safely."""
    path, function = parse_spec(spec)
    if area < 0 or area % 8 or area > 1 << 20:
        raise CallbackError(f"--call-area {area}: a multiple of 8 bytes, at most 1 MiB")
    with tempfile.TemporaryDirectory(prefix="urewrite-call-") as tmp:
        compiler = _compiler(backend)
        if path.endswith(".c"):
            obj = os.path.join(tmp, "callback.o")
            _run(compiler + list(backend.callback_flags) + _COMMON_FLAGS +
                 ["-I", HEADER_DIR, "-fstack-usage", "-c", path, "-o", obj], spec)
            _check_stack(os.path.join(tmp, "callback.su"), spec)
        else:
            obj = path
        linked = os.path.join(tmp, "callback.so")
        _run(compiler + ["-nostdlib", "-shared", "-Wl,--no-undefined", "-Wl,-Bsymbolic",
                         "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=4096",
                         "-Wl,-z,norelro", "-Wl,--build-id=none", "-Wl,-z,noexecstack",
                         obj, "-o", linked], spec)
        return _read(linked, spec, function, backend, area, map_size)


# Flags for every machine: freestanding, position-independent code that calls nothing
# outside itself and keeps no unwind tables or stack protector (there is no library).
_COMMON_FLAGS = ["-O2", "-ffreestanding", "-fno-builtin", "-fPIC", "-fvisibility=hidden",
                 "-fno-stack-protector", "-fno-asynchronous-unwind-tables",
                 "-fno-unwind-tables", "-fno-exceptions", "-fno-plt", "-std=gnu11"]


def _compiler(backend) -> List[str]:
    """The machine's C compiler: this host's own for its machine ($CC, else cc), else a
    GNU cross compiler (TRIPLET-gcc)."""
    native = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu",
              "arm64": "aarch64-linux-gnu"}.get(platform.machine())
    name = os.environ.get("CC", "cc") if native == backend.gnu_triplet else \
        f"{backend.gnu_triplet}-gcc"
    found = shutil.which(name.split()[0])
    if found is None:
        raise CallbackError(f"--call: no C compiler for {backend.name} ({name}): install it "
                            f"(Debian: gcc{'' if native == backend.gnu_triplet else '-' + backend.gnu_triplet})")
    return name.split()


def _run(command: List[str], spec: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        return
    text = done.stderr
    missing = re.search(r"undefined reference to [`']([^'`]+)'", text)
    if missing:
        raise CallbackError(f"--call {spec}: the callback calls {missing.group(1)}, which it "
                            f"cannot: a callback has no C library (use urewrite.h's helpers)")
    errors = [line for line in text.splitlines() if "error" in line] or text.splitlines()
    raise CallbackError(f"--call {spec}: {errors[0].strip() if errors else 'the compiler failed'}")


def _check_stack(su_path: str, spec: str) -> None:
    """The stack the callback's functions take (gcc's -fstack-usage), added up as if
    each called the next: at most STACK_LIMIT, none of a size known only at run time."""
    total = 0
    try:
        with open(su_path) as f:
            rows = [line.rsplit("\t", 2) for line in f if line.strip()]
    except OSError:
        return  # (a compiler without -fstack-usage: nothing to go by)
    for where, size, qualifier in rows:
        if "dynamic" in qualifier and "bounded" not in qualifier:
            raise CallbackError(f"--call {spec}: {where.rsplit(':', 1)[-1]} takes stack of a "
                                f"size known only at run time (alloca, a variable array)")
        total += int(size)
    if total > STACK_LIMIT:
        raise CallbackError(f"--call {spec}: the callback takes {total} bytes of stack; a "
                            f"probe gives it {STACK_LIMIT}")


def _read(linked: str, spec: str, function: str, backend, area: int,
          map_size: int) -> Callback:
    """The linked object laid flat, checked, its maps and what it reads found."""
    import lief
    elf = lief.ELF.parse(linked)
    if elf is None:
        raise CallbackError(f"--call {spec}: the linker wrote no object")
    if elf.header.machine_type.value != backend.elf_machine:
        raise CallbackError(f"--call {spec}: the object is not for this file's machine")
    if len(elf.dynamic_relocations) or len(elf.pltgot_relocations):
        raise CallbackError(f"--call {spec}: the callback needs relocating when it is "
                            f"loaded (a pointer in its data): keep pointers out of "
                            f"initialised data")
    for section in elf.sections:
        writable = section.has(lief.ELF.Section.FLAGS.WRITE)
        if writable and section.size and section.name not in READ_ONLY_AT_RUN:
            raise CallbackError(f"--call {spec}: the callback has writable data ({section.name},"
                                f" {section.size} bytes), which its read-only code cannot "
                                f"keep: use a map (UREWRITE_MAP) or ctx->area")
    loads = [s for s in elf.segments if s.type == lief.ELF.Segment.TYPE.LOAD]
    end = max(s.virtual_address + s.virtual_size for s in loads)
    blob = bytearray(end)
    for segment in loads:
        content = bytes(segment.content)
        blob[segment.virtual_address:segment.virtual_address + len(content)] = content
    found = [s for s in elf.symtab_symbols if s.name == function and
             s.type == lief.ELF.Symbol.TYPE.FUNC and s.shndx != 0]
    if not found:
        raise CallbackError(f"--call {spec}: no function {function} in {spec.rpartition(':')[0]}")
    for section in elf.sections:  # (its code: the segment holds the ELF's tables too)
        if section.has(lief.ELF.Section.FLAGS.EXECINSTR) and section.size:
            start = section.virtual_address
            why = backend.callback_refusal(bytes(blob[start:start + section.size]), start)
            if why:
                raise CallbackError(f"--call {spec}: {why}")
    records, shapes = _maps(elf, blob, spec, map_size)
    reads = elf.get_section(READS_SECTION)
    said = struct.unpack_from("<Q", blob, reads.virtual_address)[0] if reads else \
        program_file.USES_NSECS | program_file.USES_TID | program_file.USES_COMM
    arguments = (said >> 8 & 0xFF) - 1  # UREWRITE_ARGS(n): n + 1 there; 0: not said
    if arguments > program_file.ARGUMENTS:
        raise CallbackError(f"--call {spec}: UREWRITE_ARGS({arguments}): a context holds "
                            f"{program_file.ARGUMENTS}")
    built = Callback(spec, backend, bytes(blob), found[0].value, records, shapes,
                     said & 7 | _ALWAYS, area)
    built.read = arguments if arguments >= 0 else program_file.ARGUMENTS
    words = backend.context_read(bytes(blob), found[0].value)
    if words is not None:  # (its code says what it may read: the rest is not filled in)
        built.uses &= program_file.context_uses(words)
        built.read = min(built.read, max((w // 8 + 1 for w in words
                                          if w < program_file.ARGUMENTS * 8), default=0))
    return built


# what a callback's context holds whatever it says it reads (UREWRITE_READS)
_ALWAYS = program_file.USES_PID | program_file.USES_EVENT | program_file.USES_MAPS | \
    program_file.USES_PROBE | program_file.USES_AREA


def _maps(elf, blob: bytearray, spec: str, map_size: int):
    section = elf.get_section(MAP_SECTION)
    if section is None:
        return [], []
    capacity = 1 << max(map_size - 1, 1).bit_length()
    records, shapes, names = [], [], set()
    for at in range(section.virtual_address, section.virtual_address + section.size,
                    MAP_RECORD.size):
        magic, kind, keys, low, high, step, raw, _, _, _ = MAP_RECORD.unpack_from(blob, at)
        name = raw.split(b"\0", 1)[0].decode("ascii", "replace")
        if magic != MAP_MAGIC or kind not in KINDS:
            raise CallbackError(f"--call {spec}: a map declared other than with UREWRITE_MAP")
        if not 0 <= keys <= MAX_KEYS:
            raise CallbackError(f"--call {spec}: map {name} has {keys} keys; at most {MAX_KEYS}")
        if KINDS[kind] == "lhist" and (not 0 <= low < high or step <= 0):
            raise CallbackError(f"--call {spec}: map {name}: an lhist needs 0 <= low < high "
                                f"and a step above 0 (as bpftrace's)")
        if name in names:
            raise CallbackError(f"--call {spec}: two maps named {name}")
        names.add(name)
        if KINDS[kind] == "hist":
            words = M.HIST_BUCKETS
        elif KINDS[kind] == "lhist":
            words = (high - low) // step + 2
        else:
            words = 2 if KINDS[kind] == "avg" else 1
        records.append(at)
        shapes.append(M.MapShape(name, KINDS[kind], (INT,) * keys, words,
                                 capacity if keys else 1, KINDS[kind] != "count",
                                 (low, high, step) if KINDS[kind] == "lhist" else None))
    return records, shapes


def attach(callback: Callback, targets) -> None:
    """Runs the callback at every probe of each target (attach.Target): their `runs`
    and `keys`, and the callback's `code` (a stub per probe, each with an area of its
    own in the maps file)."""
    at = M.layout(callback.maps)[1]
    carried = [n for t in targets.values() for n in (t.arguments or [-1] * len(t.probes))]
    # (-1: a probe table that does not say: all of them)
    callback.filled = min(callback.read, program_file.ARGUMENTS if any(n < 0 for n in carried)
                          else max(carried, default=0))
    for t in targets.values():
        for number, (name, kind, _) in enumerate(t.probes):
            key = f"call\0{t.tag}\0{number}"  # (its own code at each probe: its stub)
            t.add_run(number, RUN)
            t.keys[(number, RUN)] = key
            callback.code[key] = (number, kind, name, at)
            at += callback.area
    callback.areas_end = at


def assemble(callback: Callback, offsets: List[int]) -> Tuple[bytes, Dict[str, int]]:
    """program_file's code of a callback (attach.program_blob's `assemble`): the linked
    code with its maps' fields filled in, the probes' names, then a stub per probe."""
    blob = bytearray(callback.blob)
    for record, shape, table in zip(callback.map_records, callback.maps, offsets):
        struct.pack_into("<3Q", blob, record + MAP_FILLED, table, shape.capacity,
                         shape.entry_words)
    keys = list(callback.code)
    names = {}
    for key in keys:
        blob += b"\0" * (-len(blob) % 8)
        names[key] = len(blob)
        blob += callback.code[key][2].encode()[:255] + b"\0"
    blob += b"\0" * (-len(blob) % 16)
    stubs = [(number, kind & 0xFF, names[key], area, callback.filled, callback.read,
              callback.uses)
             for key, (number, kind, _, area) in ((k, callback.code[k]) for k in keys)]
    code, starts = callback.backend.callback_stubs(len(blob), stubs, callback.function)
    return bytes(blob) + code, dict(zip(keys, starts))


def event_line(words: List[int]) -> str:
    """An emitted event as `urewrite run` prints it."""
    return " ".join(str(w) for w in words)


def rewrite_step(callback: Callback, path: str, input: str):
    """pipeline.rewrite's `built_in(probes, machine)` for a callback given to a rewrite:
    the program file that runs it at every probe of the output (`path`; its USDT
    probes' arguments as the notes of `input` say)."""
    from urewrite.programs import attach as A

    def step(probes, machine):
        if machine != callback.backend.elf_machine:
            raise CallbackError(f"--call {callback.label}: built for another machine")
        t = A.Target(path, "", machine, [(p.name, p.kind, p.address) for p in probes],
                     [p.arguments for p in probes], notes_from=input)
        built = dataclasses.replace(callback, code={})
        attach(built, {"": t})
        return A.built_program(t, built, None, lambda _, lowered, offsets:
                               assemble(lowered, offsets), callback.backend)
    return step
