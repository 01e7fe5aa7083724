"""Attaches a program to rewritten files: which of a file's probes (by number) runs
which of the program's probes, and the files `urewrite run` leaves for the file's
runtime to map (trampolines/program_file.py)."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from urewrite.programs import lower as L
from urewrite.programs import maps as M
from urewrite.programs.parser import ProgramError
from urewrite.programs.probes import spec_of
from urewrite.programs.syntax import Probe
from urewrite.trampolines import program_file
from urewrite.trampolines.program_file import DirectEntry
from urewrite.trampolines.region import (KIND_ADDRESS, KIND_ENTRY, KIND_RETURN, KIND_USDT,
                                         template_probe_arguments, template_probes)

MAX_ENTRY_ARGUMENTS = 6  # (the rewrite's --args)
BUILT_IN_MACHINES = {62, 183}  # x86_64, arm64: runtimes that run a program built in
_KIND = {"uprobe": KIND_ENTRY, "uretprobe": KIND_RETURN, "usdt": KIND_USDT}


@dataclass
class Target:
    """A rewritten file the program has probes in."""
    path: str
    tag: str  # its region files' tag
    machine: int
    probes: List[tuple]  # (name, kind, address) by probe number
    arguments: List[int] = field(default_factory=list)  # values each one's events carry (-1:
    # not said)
    # the file whose USDT notes say the probes' arguments, where not `path`: a rewrite's
    # input, as its output is not written yet (or is an older rewrite)
    notes_from: str = ""
    # probe number -> the program's probes that run there (their texts, in the program's
    # order: a file probe two of them match runs both)
    runs: Dict[int, List[str]] = field(default_factory=dict)
    keys: Dict[tuple, str] = field(default_factory=dict)  # (number, text) -> its code's key,
    # where it has code of its own there (lower.lower's expansions)

    def add_run(self, number: int, text: str) -> None:
        texts = self.runs.setdefault(number, [])
        if text not in texts:
            texts.append(text)

    def code_keys(self, number: int, code: Dict[str, list]) -> List[str]:
        """The keys of the code that runs at probe `number`, in order: each text's, or
        its own there where it has one (lower.lower's expansions)."""
        keys = [self.keys.get((number, text)) for text in self.runs[number]]
        return [key if key in code else text for key, text in zip(keys, self.runs[number])]


def target(path: str) -> Target:
    """The rewritten file at `path`: a ProgramError when it is not one."""
    from urewrite.errors import UrewriteError
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.trampolines import live_note
    try:
        elf = ElfFile.open(path)
    except (UrewriteError, OSError) as e:
        raise ProgramError(f"{path}: {e}")
    section = elf.section_named(".urewrite.rodata")
    note = live_note.read(path)
    template = elf.data[section.offset:section.offset + section.size] if section else b""
    probes = template_probes(template)
    if not probes or note is None:
        raise ProgramError(f"{path} is not rewritten by urewrite: rewrite it with the probes "
                           f"the program names (urewrite FILE -e PROGRAM -o OUT)")
    from urewrite.rewriter.go_runtime import is_go_program
    if is_go_program(elf):  # a goroutine's stack may leave 200 bytes; a program takes more
        raise ProgramError(f"{path} is a Go program: probe programs do not run in Go code yet")
    carried = template_probe_arguments(template)
    text = elf.section_named(".urewrite.text")
    runs_ours = text is not None and program_file.MAGIC.to_bytes(8, "little") in \
        elf.data[text.offset:text.offset + text.size]  # (its runtime's check of the magic)
    if carried and all(n < 0 for n in carried) or not runs_ours:  # (a runtime of before
        # this program file's format, which maps none)
        raise ProgramError(f"{path} was rewritten by an earlier urewrite, whose probes run "
                           f"no program of this one: rewrite it again")
    return Target(path, note.tag, elf.machine, probes, carried)


def resolve(probe: Probe, command: List[str]) -> Optional[str]:
    """The file a probe's path names: the path itself, or the command's program (by
    its basename, or for '*')."""
    program = shutil.which(command[0]) if command else None
    if probe.path == "*":
        return program
    if os.path.exists(probe.path):
        return probe.path
    if program and os.path.basename(program) == os.path.basename(probe.path):
        return program
    return None


def attach(targets: Dict[str, Target], blocks, command: List[str]) -> None:
    """Fills each target's `runs`; a ProgramError naming a probe a file lacks, with the
    rewrite that adds it."""
    missing: Dict[str, List[Probe]] = {}
    for block in blocks:
        for probe in block.probes:
            if probe.kind in ("BEGIN", "END"):
                continue
            path = resolve(probe, command)
            if path is None:
                raise ProgramError(f"{probe.text}: no file {probe.path} (nor a program of "
                                   f"that name to run)", probe.at)
            key = os.path.realpath(path)
            if key not in targets:
                targets[key] = target(path)
            found = _numbers(targets[key], probe)
            if not found:
                missing.setdefault(path, []).append(probe)
            for number in found:
                targets[key].add_run(number, probe.text)
    for path, probes in missing.items():
        entries = " ".join(f"-p '{spec_of(p)}'" for p in probes if p.kind != "uretprobe")
        returns = " ".join(f"-r '{spec_of(p)}'" for p in probes if p.kind == "uretprobe")
        raise ProgramError(f"{path} was not rewritten with {', '.join(p.text for p in probes)}: "
                           f"rewrite the original with them, e.g. urewrite ORIGINAL "
                           f"{' '.join(x for x in (entries, returns) if x)} ... -o {path} "
                           f"(or urewrite ORIGINAL -e PROGRAM -o {path})")


def _numbers(target: Target, probe: Probe) -> List[int]:
    """The numbers of the file's probes that are `probe`."""
    kind = _KIND[probe.kind]
    out = []
    for number, (name, probe_kind, address) in enumerate(target.probes):
        if probe.kind == "usdt":
            provider, _, short = name.partition(":")
            if probe_kind == KIND_USDT and fnmatch.fnmatchcase(short, probe.name) and \
                    fnmatch.fnmatchcase(provider, probe.provider):
                out.append(number)
        elif probe.address is not None:
            if probe_kind in (KIND_ENTRY, KIND_ADDRESS) and address == probe.address:
                out.append(number)
        elif probe.offset:
            if probe_kind == KIND_ADDRESS and name == f"{probe.function}+{probe.offset:#x}":
                out.append(number)
        elif probe_kind == kind and fnmatch.fnmatchcase(name, probe.function):
            out.append(number)
    return out


def expansions(targets: Dict[str, Target], blocks) -> Dict[str, Dict[str, tuple]]:
    """What `probe` and `func` read at each probe a program's probe matched, as bpftrace
    has them (the path as the program gives it, the function or USDT name matched), by
    program probe text and a key (lower.lower's `expansions`; Target.keys)."""
    probes = {p.text: p for block in blocks for p in block.probes}
    out: Dict[str, Dict[str, tuple]] = {}
    for t in targets.values():
        for number, texts in t.runs.items():
            name = t.probes[number][0]
            for text in texts:
                probe = probes[text]
                if probe.kind == "usdt":
                    values = (f"usdt:{probe.path}:{name}", name.partition(":")[2])
                elif probe.address is None and not probe.offset:
                    values = (f"{probe.kind}:{probe.path}:{name}", name)
                else:  # (an address: the probe as given)
                    continue
                key = f"{text}\0{values[0]}"
                out.setdefault(text, {})[key] = values
                t.keys[(number, text)] = key
    return out


def lower(checked, targets: Dict[str, Target], map_size: int = M.KEYED_CAPACITY) -> L.Lowered:
    """The program's code for the probes it attached to in `targets` (`probe` and
    `func` as each matched probe has them: `expansions`)."""
    blocks = checked.program.blocks
    return L.lower(checked, {p.text: (p.text, p.function or p.name or "")
                             for b in blocks for p in b.probes},
                   map_size, expansions(targets, blocks))


def check_arguments(targets: Dict[str, Target], lowered: L.Lowered) -> None:
    """A ProgramError where a probe's code reads an argument its file's probe does not
    record (it would read 0), with the rewrite that records it."""
    for t in targets.values():
        for number, text in sorted((n, x) for n, texts in t.runs.items() for x in texts):
            read = max((op[1] + 1 for op in lowered.code.get(text, ()) if op[0] == "arg"),
                       default=0)
            carried = t.arguments[number] if number < len(t.arguments) else -1
            if carried < 0 or read <= carried:
                continue
            name, kind, _ = t.probes[number]
            if kind == KIND_RETURN:
                raise ProgramError(f"{text}: {t.path} records no return value for {name} "
                                   f"(its returns are tail calls)")
            if kind == KIND_USDT:
                raise ProgramError(f"{text}: usdt probe {name} has {carried} argument"
                                   f"{'' if carried == 1 else 's'}, the program reads "
                                   f"arg{read - 1}")
            how = f"rewrite the original with --args {read} (or urewrite ORIGINAL -e " \
                  f"PROGRAM -o {t.path})" if read <= MAX_ENTRY_ARGUMENTS else \
                  f"a rewrite records at most {MAX_ENTRY_ARGUMENTS} of a function's arguments"
            raise ProgramError(f"{text}: {t.path} records {carried} argument"
                               f"{'' if carried == 1 else 's'} at {name}, the program reads "
                               f"arg{read - 1}: {how}")


def write_files(directory: str, targets: Dict[str, Target], lowered: L.Lowered,
                assemble, backend_of=lambda machine: None) -> str:
    """TAG.program and TAG.maps of every target in `directory` (one maps file, linked
    under each tag: the program's maps are one for all files and processes); the
    maps file's path. `assemble(machine, lowered, offsets)` gives the code and each
    probe text's function offset; `backend_of(machine)` the backend (arch/) that makes
    the direct entries (None: none)."""
    check_arguments(targets, lowered)
    run = int.from_bytes(os.urandom(8), "little") | 1
    maps_path = None
    for t in targets.values():
        blob = program_blob(t, lowered, run, assemble, backend_of(t.machine))
        _create(os.path.join(directory, t.tag + program_file.PROGRAM_SUFFIX), blob, 0o644)
        maps = os.path.join(directory, t.tag + program_file.MAPS_SUFFIX)
        if maps_path is None:
            _create(maps, lowered.initial_maps(run), 0o600)
            maps_path = maps
        else:
            os.link(maps_path, maps)
    return maps_path


def program_blob(t: Target, lowered: L.Lowered, run: Optional[int], assemble,
                 backend=None) -> bytes:
    """The program file of target `t` (trampolines/program_file.py) for run `run`; None:
    a run number of the file's own making (a hash of it), so that a rewrite that builds
    the program in writes the same bytes each time. `backend`: the machine's, which
    makes the direct entries (None: none)."""
    return built_program(t, lowered, run, assemble, backend).blob


def built_program(t: Target, lowered: L.Lowered, run: Optional[int], assemble,
                  backend=None) -> program_file.BuiltProgram:
    """program_blob()'s file, with what each probe's direct entry was made of."""
    offsets, _ = M.layout(lowered.maps)
    size = lowered.maps_bytes()
    runs = {number: _code_of(t.code_keys(number, lowered.code), lowered.code)
            for number in t.runs}
    only = dataclasses.replace(lowered, code=dict(runs.values()))
    code, functions = assemble(t.machine, only, offsets)
    entries = {number: functions[key] for number, (key, _) in runs.items()}
    code, direct, made = direct_entries(t, lowered, runs, functions, code, backend,
                                        (only, offsets))
    head = M.head_bytes(lowered.maps)

    def blob(run: int) -> bytes:
        area = bytes(M.initial_area(lowered.maps, run)[:head])
        return program_file.build(len(t.probes), code, entries, run, lowered.uses,
                                  lowered.arguments, area, size, direct)
    if run is None:
        run = int.from_bytes(hashlib.sha256(blob(0)).digest()[:8], "little") | 1
    code_at = program_file.code_start(len(t.probes), head, direct is not None)
    return program_file.BuiltProgram(blob(run), {
        number: dataclasses.replace(entry, function=code_at + entry.function)
        for number, entry in made.items() if entry is not None},
        {number: code_at + at for number, at in (direct or {}).items()})


def direct_entries(t: Target, lowered, runs: Dict[int, tuple], functions: Dict[str, int],
                   code: bytes, backend, source: tuple = None):
    """(the code with the probes' direct entries after it, {probe number: its entry's
    offset}, {probe number: the DirectEntry it was made from, or None}), or (code,
    None, {}) where the machine's trampolines call none. A probe whose arguments the
    tracer cannot tell, or the entry cannot read, gets one that sends its hits to the
    trace path (trampolines/program_file.py); a probe that runs no code, none (nothing
    to run: the table's 0). `source`: (the lowered program the code was made of, its
    maps' offsets), with which a program's entries may hold its functions' code in
    line (Backend.program_with_entries), up to INLINED entries."""
    if backend is None or not backend.direct_calls:
        return code, None, {}
    specs = _ArgumentSpecs(t, backend)
    memo: dict = {}  # (registers_written's: a callback's stubs share their function)
    stubs_write: list = []  # (a callback's stubs are one sequence of instructions, their
    # constants aside: what one writes, all write)
    wanted: Dict[int, Optional[DirectEntry]] = {}
    for number, (key, ops) in runs.items():
        expected = specs(number)
        reads, uses, predicate = _code_shape(lowered, ops)
        if expected is None:
            wanted[number] = None
            continue
        if isinstance(ops, list):
            writes = backend.registers_written(code, functions[key], memo)
            called = functions[key]
        else:
            if not stubs_write:
                stubs_write.append(backend.registers_written(code, functions[key], memo))
            writes = stubs_write[0]
            called = lowered.called_at(functions[key])
        # (an entry that reads none checks none: one for all; entries alike are one)
        entry = DirectEntry(called, tuple(expected) if reads else (), reads, uses,
                            predicate, writes, aligned=not isinstance(ops, list))
        wanted[number] = entry if entry and backend.direct_supported(entry) else None
    base = len(code) + (-len(code) % 16)
    head = M.head_bytes(lowered.maps)
    run_at = program_file.RUN_AT - program_file.code_start(len(t.probes), head, True)
    distinct = list(dict.fromkeys(wanted.values()))
    if not distinct:
        return code, {}, wanted
    if source is not None and len(distinct) <= INLINED and \
            all(isinstance(ops, list) for _, ops in runs.values()):  # (a program's code)
        key_of = {}
        for number, (key, _) in runs.items():
            key_of.setdefault(wanted.get(number), key)
        made = backend.program_with_entries(*source, run_at, [(e, key_of[e]) for e in distinct])
        if made is not None:
            full, starts = made
            # (its functions where the table and the built-in calls have them)
            assert full[:len(code)] == code, "a program's code changed with its entries"
            at = dict(zip(distinct, starts))
            return full, {n: at[e] for n, e in wanted.items()}, wanted
    more, starts = backend.direct_entries(base, run_at, distinct)
    at = {entry: base + start for entry, start in zip(distinct, starts)}
    return code.ljust(base, b"\0") + more, {n: at[e] for n, e in wanted.items()}, wanted


# Entries that hold their function's code in line, at most: each is a copy of its
# probe's code, and the program's code is assembled once more with them (937 probes'
# own `@[probe] = count()`: 1.24 s to write the files, against 0.77)
INLINED = 2048


def _code_shape(lowered, ops) -> tuple:
    """(the arguments the code reads, the context's USES_* it reads, its leading
    predicate or None) of one probe's operations; a callback's (whose code is not
    operations): what the whole reads."""
    if not isinstance(ops, list):
        return lowered.arguments, lowered.uses, None
    one = dataclasses.replace(lowered, code={"": ops})
    return one.arguments, one.uses, L.leading_predicate(ops)


class _ArgumentSpecs:
    """The ArgSpecs a rewrite recorded at a probe of a file, as far as the tracer can
    tell them: its calling convention's (the C ABI: Go programs run no program), or
    its USDT note's (by the probe's address); None where it cannot."""

    def __init__(self, t: Target, backend):
        self.t, self.backend = t, backend
        self._notes = None

    def __call__(self, number: int):
        _, kind, address = self.t.probes[number]
        carried = self.t.arguments[number] if number < len(self.t.arguments) else -1
        try:
            if kind in (KIND_ENTRY, KIND_ADDRESS):
                return self.backend.abi_arguments(carried) if carried > 0 else []
            if kind == KIND_RETURN:
                return self.backend.return_value() if carried > 0 else []
            if kind == KIND_USDT:
                return self._usdt(address)
        except ValueError:
            return None
        return None

    def _usdt(self, address: int):
        if self._notes is None:
            self._notes = {}
            from urewrite.errors import UrewriteError
            from urewrite.rewriter import usdt
            from urewrite.rewriter.elf_file import ElfFile
            try:
                elf = ElfFile.open(self.t.notes_from or self.t.path)
            except (UrewriteError, OSError):  # (no file to read: no direct entries)
                return None
            symbols = usdt.Symbols(elf)
            for site in usdt.discover(elf):
                self._notes.setdefault(site.pc, (site.arguments, symbols))
        found = self._notes.get(address)
        if found is None:
            return None
        text, symbols = found
        return self.backend.sdt_arguments(text, symbols)


def rewrite_step(checked, paths: List[str], assemble, note=lambda why: None,
                 backend_of=lambda machine: None):
    """pipeline.rewrite's `built_in(probes, machine)` for a program given to a rewrite:
    built_in() with the output's probe table, or None with `note(why)` where it is not
    built in (a program with printf() or exit(), whose events would go to no reader; a machine
    whose runtime runs none)."""
    from urewrite.programs.probes import prints

    def step(probes, machine):
        printing = prints(checked.program)
        if machine not in BUILT_IN_MACHINES or printing:
            note("it has printf(), exit(), print(), clear() or zero(): a tracer's work"
                 if printing else "its runtime runs none")
            return None
        return built_in(checked, paths, [(p.name, p.kind, p.address, p.arguments)
                                         for p in probes], machine, assemble,
                        backend=backend_of(machine))
    return step


def built_in(checked, paths: List[str], probes: List[tuple], machine: int, assemble,
             map_size: int = M.KEYED_CAPACITY,
             backend=None) -> Optional[program_file.BuiltProgram]:
    """The program file of a program built into a rewrite's probes (pipeline.rewrite's
    `built_in`), for the probes it names in the file (`paths`: the names it goes by, the
    input first, the output last), given the output's probe table: (name, kind, address,
    arguments) by number; None when it names none of them, or the machine's runtime runs
    none (BUILT_IN_MACHINES)."""
    if machine not in BUILT_IN_MACHINES:
        return None
    from urewrite.programs.probes import names_file
    t = Target(paths[-1], "", machine, [p[:3] for p in probes], [p[3] for p in probes],
               notes_from=paths[0])
    blocks = checked.program.blocks
    for block in blocks:
        for probe in block.probes:
            if probe.kind not in ("BEGIN", "END") and names_file(probe, paths):
                for number in _numbers(t, probe):
                    t.add_run(number, probe.text)
    if not t.runs:
        return None
    lowered = lower(checked, {"": t}, map_size)
    check_arguments({"": t}, lowered)
    return built_program(t, lowered, None, assemble, backend)


def _code_of(keys: List[str], code: Dict[str, list]) -> tuple:
    """(key, operations) of the code that runs the code of each key in turn."""
    if len(keys) == 1:
        return keys[0], code[keys[0]]
    ops = [op for key in keys for op in code[key][:-1]]  # (each ends with its return)
    return "\1".join(keys), ops + [("return",)]


def _create(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)  # (whatever the umask)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
