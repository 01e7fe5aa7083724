"""x86_64 direct entries: how a probe's hit reaches its program without the runtime.

A trampoline whose process runs a program (the region's trace flag set) calls the
probe's direct entry from its counting code (trampoline.py, `direct_call`), the
site's rcx, rax, rdx and rsi on the stack as the counting code saved them:

    [rsp] return address, [rsp + 8] rsi, + 16 rdx, + 24 rax, + 32 rcx of the site;
    the site's rsp is rsp + 40 + 128 (the red zone skipped: no Go code comes here)
    rcx = the point's argument descriptors (trampolines/arguments.py)
    rsi = the binding: the state memory's words at trampoline.DIRECT (below)
    every other register as at the site, but rax (the flags where they are live)

The entry keeps every register but rcx, rdx, rsi and the flags, and returns ecx = 0
(done: run, or nothing to run) or 1: the point's arguments are not the ones the
entry was made for (its descriptors differ: a USDT probe's sites may name other
registers; an exit at a tail call reads none), and the trampoline takes the trace
path, whose runtime routine reads them as the descriptors say.

An entry checks the descriptors of the arguments the code reads (two compares each),
then a leading predicate on an argument and a constant with no call (a false one
returns there: the cost of a filter), then that the maps are its run's (a live
re-arm may be replacing both). Code that only adds to a map entry whose place is
known when compiled (`@[probe] = count()`) is done right there, with the maps in rcx
and nothing saved (program_code.quick_update), unless that entry is not made yet.
Else the entry saves the registers the function may clobber
(r8 to r11 only where its code may write them: DirectEntry.writes), fills the context
on the stack (the arguments straight from the registers, maps; pid, the printf
routine, the clock, the thread's id and name only where the code reads them) and
calls the function (`void f(context *)`, the SysV ABI; for a program's own code,
which needs no alignment, the stack is left as it is and rbp is not used).

The binding, written by the runtime's program_setup (runtime.s) while it sets up:
    [+0] the direct table (program_file.py), or 0   [+8] this process's maps
    [+16] the printf routine   [+24] thread id routine: rdi = region -> rax
    [+32] thread name routine: rdi = region, rsi = 64 bytes to fill
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

from urewrite.arch.x86_64.arguments import SLOT
from urewrite.arch.x86_64.program_code import _extend, condition, float_test
from urewrite.trampolines import program_file as P
from urewrite.trampolines.program_file import DirectEntry
from urewrite.trampolines import region
from urewrite.trampolines.arguments import (CONSTANT, LINKED_MEMORY, MEMORY, NO_SLOT,
                                            REGISTER, THREAD_MEMORY, encode)

# the binding's offset in the state memory's first page: in the region word's line (at
# 0), which every hit's check has just read, so a program's hit finds it there (a cold
# line less in a server: 9% of a PostgreSQL probe's program samples sat on its load)
DIRECT = 24
BINDING_MAPS, BINDING_EVENT, BINDING_TID, BINDING_COMM = 8, 16, 24, 32
RED_ZONE = 128
_NAMES = {slot: name for name, slot in SLOT.items()}
_SAVED = ("rbp", "rax", "rdi", "r8", "r9", "r10", "r11")  # what the function may clobber
_OWN = ("rbp", "rax", "rdi")  # what the entry itself uses: its frame, scratch, the context
_CALLED_CLOBBERS = ("r8", "r9", "r10", "r11")  # what a runtime routine it calls may clobber
# beyond rax, rcx, rdx, rsi, rdi
_TRAMPOLINE_SAVED = {"rsi": 8, "rdx": 16, "rax": 24, "rcx": 32}  # from the entry's rsp


def assemble(base: int, run_at: int, entries: Sequence[Optional[DirectEntry]]) -> \
        Tuple[bytes, List[int]]:
    """Backend.direct_entries: the entries' code at `base` in the program's code, the
    header's run at `run_at` (relative to the code's start), and where each starts
    (an entry None: one that sends every hit to the trace path)."""
    # Entries that differ only in the function they call (a callback's, one stub a
    # probe) are assembled once, then copied with that call and the run's address
    # (RIP-relative) set for each place: Keystone takes ~0.1 ms an entry, and a
    # callback at every function of a big file has tens of thousands
    from urewrite.arch.runtime_asm import assemble_with_starts
    shapes = {}  # entry with function 0 -> (k, the first entry of that shape)
    for entry in entries:
        shapes.setdefault(_shape(entry), (len(shapes), entry))
    lines, labels = ["d_base:"], []  # (at `base`: the run is at d_base + run_at - base)
    for k, entry in shapes.values():
        lines += [f"d{k}:", "mov ecx, 1", "ret"] if entry is None else \
            _entry(f"d{k}", entry, run_at - base)
        labels += [f"d{k}"] + ([] if entry is None else [f"d{k}_run_word", f"d{k}_call"])
    code, found = assemble_with_starts("".join(line + "\n" for line in lines + ["d_end:"]),
                                       labels + ["d_end"], base, "KS_ARCH_X86", "KS_MODE_64",
                                       "a program's direct entries")
    at = dict(zip(labels + ["d_end"], found))
    bounds = [at[f"d{k}"] for k in range(len(shapes))] + [at["d_end"]]  # (laid out in order)
    pieces = {}  # shape -> (its bytes, where its run's compare and its call are in them)
    for shape, (k, entry) in shapes.items():
        start = bounds[k]
        pieces[shape] = (code[start - base:bounds[k + 1] - base], None if entry is None else
                         (at[f"d{k}_run_word"] - start, at[f"d{k}_call"] - start))
    out, starts = bytearray(), []
    for entry in entries:
        piece, places = pieces[_shape(entry)]
        here = len(out)  # (from base)
        starts.append(here)
        out += piece
        if places:  # cmp rdx, [rip + run]: 48 3b 15 disp32; call: e8 rel32
            run, call = here + places[0], here + places[1]
            assert out[run:run + 3] == b"\x48\x3b\x15" and out[call] == 0xE8
            out[run + 3:run + 7] = _rel32(run_at - (base + run + 7))
            out[call + 1:call + 5] = _rel32(entry.function - (base + call + 5))
    return bytes(out), starts


def assemble_with_code(text: str, run_at: int, entries: Sequence[Optional[DirectEntry]],
                       bodies: Sequence[Optional[tuple]]) -> Tuple[bytes, List[int]]:
    """Backend.program_with_entries: a program's code (`text`, program_code.source's),
    then its entries, each with its function's code in line where `bodies` gives it
    (program_code.function_parts: no call between the entry and the code, nor a `ret`
    back: about 0.5 ns a hit here), in one text, so that the code's labels (its lookups,
    its strings) hold in the copies. The code first, as it is alone: its functions stay
    where they are, for the runtime's trace path. A body is (hot lines, cold lines, and
    where not None, lines run first with the maps in rcx and nothing saved:
    program_code.quick_update's, which go on to full_label(k) where they cannot do the
    work)."""
    from urewrite.arch.runtime_asm import assemble_with_starts
    lines = ["d_base:", text, ".align 16"]
    for k, (entry, body) in enumerate(zip(entries, bodies)):
        lines += [f"{_label(k)}:", "mov ecx, 1", "ret"] if entry is None else \
            _entry(_label(k), entry, run_at, body)
    return assemble_with_starts("".join(line + "\n" for line in lines),
                                [_label(k) for k in range(len(entries))], 0, "KS_ARCH_X86",
                                "KS_MODE_64", "a program's direct entries")


def _label(k: int) -> str:
    return f"d{k}"


def full_label(k: int) -> str:
    """Where entry k's whole path starts, past its quick lines (assemble_with_code)."""
    return _full(_label(k))


def _full(name: str) -> str:
    return f"{name}_full"


def _rel32(delta: int) -> bytes:
    return delta.to_bytes(4, "little", signed=True)


def _shape(entry: Optional[DirectEntry]):
    return None if entry is None else dataclasses.replace(entry, function=0)


def supported(entry: DirectEntry) -> bool:
    """Whether an entry can read every argument the code reads as its specs say."""
    return all(_readable(spec) for spec in entry.expected[:entry.reads])


def _readable(spec) -> bool:
    if spec.kind == CONSTANT:
        return True
    if spec.kind == REGISTER:
        return spec.base in _NAMES
    if spec.kind in (MEMORY, LINKED_MEMORY, THREAD_MEMORY):
        return all(s == NO_SLOT or s in _NAMES for s in (spec.base, spec.index)) and \
            -(1 << 31) <= spec.value < 1 << 31
    return False


def _entry(name: str, entry: DirectEntry, run_at: int, body: Optional[tuple] = None) -> \
        List[str]:
    """The entry's text; `body`: the function's (hot, cold, quick) lines, run in line
    in place of its call (assemble_with_code)."""
    out = [f"{name}:"]
    reads = min(entry.reads, P.ARGUMENTS)
    known = min(reads, len(entry.expected))
    if reads:  # the point's descriptors: those the entry was made for?
        blob = encode(entry.expected)
        out += [f"cmp qword ptr [rcx], {len(entry.expected)}", f"jne {name}_other"]
        for j in range(known):
            head, value = (int.from_bytes(blob[8 + 16 * j + h:16 + 16 * j + h], "little",
                                          signed=True) for h in (0, 8))
            out += [f"movabs rdx, {head & (2**64 - 1):#x}",
                    f"cmp qword ptr [rcx + {8 + 16 * j}], rdx", f"jne {name}_other"]
            out += _compare_word(f"[rcx + {16 + 16 * j}]", value) + [f"jne {name}_other"]
    if entry.predicate is not None and _in_registers(entry, known):
        out += _predicate(name, entry, known)
    # Each word a tracer may change meanwhile is read once and used as checked: the
    # maps (a re-arm by another run stores its own: this code with those maps would
    # write past them) in rcx, then the context; the region (1: disarmed since) in rdx
    out += [f"{name}_run:",
            f"mov rcx, qword ptr [rsi + {BINDING_MAPS}]",  # its run's maps, or none yet
            "test rcx, rcx", f"jz {name}_done",
            "mov rdx, qword ptr [rcx + 8]",
            f"{name}_run_word:", f"cmp rdx, qword ptr [rip + d_base + {run_at}]",
            f"jne {name}_done",
            f"mov rdx, qword ptr [rsi - {DIRECT}]",
            "cmp rdx, 1", f"jbe {name}_done"]
    if body is not None and body[2] is not None:  # the code's whole work, with the maps
        out += body[2] + ["xor ecx, ecx", "ret", f"{_full(name)}:"]  # in rcx: nothing saved
    saved = _saved(entry)
    out += [f"push {r}" for r in saved]
    if entry.aligned:  # (C code: the SysV ABI's 16 bytes at the call)
        out += ["mov rbp, rsp", f"sub rsp, {P.CTX_SIZE}", "and rsp, -16"]  # rsp: the context
        frame = _Frame(8 * len(saved), saved_rbp=True)
    else:  # (a program's code: no alignment asked, no rbp to keep it)
        out += [f"sub rsp, {P.CTX_SIZE}"]
        frame = _Frame(8 * len(saved) + P.CTX_SIZE, saved_rbp=False)
    if entry.uses & P.USES_MAPS:  # (a program's code always; a callback's where it reads them)
        out += [f"mov qword ptr [rsp + {P.CTX_MAPS}], rcx"]
    for j in range(reads):
        if j < known:
            out += _value(entry.expected[j], frame, "rax")
            out.append(f"mov qword ptr [rsp + {P.CTX_ARGS + 8 * j}], rax")
        else:  # the probe has no such argument: it reads 0
            out.append(f"mov qword ptr [rsp + {P.CTX_ARGS + 8 * j}], 0")
    if entry.uses & P.USES_PID:
        out += [f"mov eax, dword ptr [rdx + {region.OFF_PID}]",
                f"mov qword ptr [rsp + {P.CTX_PID}], rax"]
    if entry.uses & P.USES_EVENT:
        out += [f"mov rax, qword ptr [rsi + {BINDING_EVENT}]",
                f"mov qword ptr [rsp + {P.CTX_EVENT}], rax"]
    out += clock_and_thread(name, entry.uses)
    call = [f"call {entry.function:#x}"] if body is None else body[0]
    out += ["mov rdi, rsp", f"{name}_call:"] + call + \
        ["mov rsp, rbp" if entry.aligned else f"add rsp, {P.CTX_SIZE}"]
    out += [f"pop {r}" for r in reversed(saved)]
    out += [f"{name}_done:", "xor ecx, ecx", "ret",
            f"{name}_other:", "mov ecx, 1", "ret"]
    return out + (body[1] if body is not None else [])


def clock_and_thread(name: str, uses: int) -> List[str]:
    """The context's nsecs, tid and comm where `uses` says the code reads them (rsp =
    the context, rdx = the region, rsi = the binding; rax, rcx and rdi clobbered, r8 to
    r11 kept around the runtime's calls). Position-independent: a trampoline that does
    an entry's work itself (built_in_call.py) takes these bytes as they are."""
    out = []
    if uses & P.USES_NSECS:  # the region's clock pair, then ticks
        out += ["mov rcx, rdx", "rdtsc", "shl rdx, 32", "or rax, rdx",
                f"sub rax, qword ptr [rcx + {region.OFF_CLOCK_REF_TICKS}]",
                f"imul qword ptr [rcx + {region.OFF_NS_MULT}]", "shrd rax, rdx, 32",
                f"add rax, qword ptr [rcx + {region.OFF_CLOCK_REF_NS}]",
                f"mov qword ptr [rsp + {P.CTX_NSECS}], rax", "mov rdx, rcx"]
    if uses & P.USES_TID:
        out += _thread_id(name) + [f"mov qword ptr [rsp + {P.CTX_TID}], rax"]
    if uses & P.USES_COMM:
        out += ["push rsi", "push rdx"] + [f"push {r}" for r in _CALLED_CLOBBERS] + [
                "mov rdi, rdx", f"lea rsi, [rsp + {48 + P.CTX_COMM}]",
                "mov rax, qword ptr [rsp + 40]", f"call qword ptr [rax + {BINDING_COMM}]"] + \
            [f"pop {r}" for r in reversed(_CALLED_CLOBBERS)] + ["pop rdx", "pop rsi"]
    return out


def _saved(entry: DirectEntry) -> Tuple[str, ...]:
    """What the entry saves: the registers it uses itself (rax, rdi, and rbp where it
    aligns the stack), and those of _SAVED the function may write (all where that is
    not known). The runtime's routines for the thread's id and name, which may clobber
    r8 to r11 too, are called with those kept around the call."""
    own = _OWN if entry.aligned else tuple(r for r in _OWN if r != "rbp")
    if entry.writes is None:
        return tuple(r for r in _SAVED if r in own or r not in _OWN)
    # (rbp: the function keeps it, as the SysV ABI's callee-saved registers)
    return tuple(r for r in _SAVED if r in own or r in entry.writes and r != "rbp")


def _thread_id(name: str) -> List[str]:
    """rax = the thread's id (rdx = the region, rsi = the binding; rcx, rdi clobbered):
    where the thread's owner entry is the first its hash names and knows the id, read
    there, as the runtime's thread_owner reads it (three calls less: 3 to 4 ns a read
    here); else that routine, through the binding."""
    slow, have = f"{name}_tid_slow", f"{name}_tid"
    return [".byte 0x64, 0x48, 0x8b, 0x0c, 0x25, 0, 0, 0, 0",  # mov rcx, fs:[0] (Keystone
            # makes `fs:[0]` RIP-relative): the thread pointer, the owner table's key
            "test rcx, rcx", f"jz {slow}",
            f"movabs rax, {region.HASH_MULTIPLIER:#x}", "imul rax, rcx",
            f"shr rax, {region.SLOT_SHIFT}", f"and eax, {region.SLOT_MASK}",
            f"mov rdi, qword ptr [rdx + {region.OFF_OWNERS}]", "add rdi, rdx", "add rdi, rax",
            "cmp qword ptr [rdi], rcx", f"jne {slow}",
            f"mov eax, dword ptr [rdi + {region.OWNER_TID}]", "test eax, eax", f"jz {slow}",
            f"movsxd rdi, dword ptr [rdi + {region.OWNER_TID_AT}]", "test rdi, rdi", f"jz {have}",
            "cmp eax, dword ptr [rcx + rdi]", f"je {have}",  # (glibc gives a new thread an
            f"{slow}:", "push rsi", "push rdx"] + [f"push {r}" for r in _CALLED_CLOBBERS] + [
            "mov rdi, rdx", f"call qword ptr [rsi + {BINDING_TID}]"] + \
        [f"pop {r}" for r in reversed(_CALLED_CLOBBERS)] + ["pop rdx", "pop rsi", f"{have}:"]


def _in_registers(entry: DirectEntry, known: int) -> bool:
    """Whether the predicate's argument needs no memory read (nor the region)."""
    if len(entry.predicate) == 5:  # a floating-point register
        return True
    n = entry.predicate[0]
    return n >= known or entry.expected[n].kind in (REGISTER, CONSTANT)


def _predicate(name: str, entry: DirectEntry, known: int) -> List[str]:
    """Nothing to do unless arg N OP constant: checked before anything is saved."""
    if len(entry.predicate) == 5:  # floating-point register N, as lower's fcompare
        n, place, op, _, kind = entry.predicate
        return [f"movq rdx, xmm{n}"] + float_test(kind, op, place, "rdx", "rcx", f"{name}_true",
                                                  f"{name}_done", f"{name}_nan") + [f"{name}_true:"]
    n, constant, op, signed = entry.predicate
    spec = entry.expected[n] if n < known else None
    if spec is not None and spec.kind == REGISTER and not spec.shift and spec.size == 8 \
            and _NAMES[spec.base] not in _TRAMPOLINE_SAVED and _NAMES[spec.base] != "rsp":
        value, register = [], _NAMES[spec.base]  # compared where it is
    else:
        value, register = (_value(spec, _Frame(0, saved_rbp=False), "rdx") if spec else
                           ["xor edx, edx"]), "rdx"
    if -(1 << 31) <= constant < 1 << 31:
        compare = [f"cmp {register}, {constant}"]
    else:
        compare = [f"movabs rcx, {constant & (2**64 - 1):#x}", f"cmp {register}, rcx"]
    # false (the case a filter is for) falls through to its return: no taken branch
    return value + compare + [f"j{condition(op, signed)} {name}_true", "xor ecx, ecx", "ret",
                              f"{name}_true:"]


def _compare_word(operand: str, value: int) -> List[str]:
    if -(1 << 31) <= value < 1 << 31:
        return [f"cmp qword ptr {operand}, {value}"]
    return [f"movabs rdx, {value & (2**64 - 1):#x}", f"cmp qword ptr {operand}, rdx"]


class _Frame:
    """Where the site's registers are, `pushed` bytes below the entry's rsp (rbp then
    holds the entry's rsp minus `pushed` where `saved_rbp`: the site's rbp is the
    first word pushed)."""

    def __init__(self, pushed: int, saved_rbp: bool):
        self.pushed, self.saved_rbp = pushed, saved_rbp
        self.base = "rbp" if saved_rbp else "rsp"

    def register(self, slot: int, into: str) -> List[str]:
        name = _NAMES[slot]
        if name == "rsp":
            return [f"lea {into}, [{self.base} + {self.pushed + 40 + RED_ZONE}]"]
        if name in _TRAMPOLINE_SAVED:
            return [f"mov {into}, qword ptr [{self.base} + {self.pushed + _TRAMPOLINE_SAVED[name]}]"]
        if name == "rbp" and self.saved_rbp:
            return [f"mov {into}, qword ptr [rbp + {self.pushed - 8}]"]
        if name in ("rax", "rdx", "rcx", "rsi"):
            raise AssertionError(name)  # (saved by the trampoline: above)
        return [f"mov {into}, {name}"]


def _value(spec, frame: _Frame, into: str) -> List[str]:
    """`into` = the argument `spec` describes (rcx may be clobbered too; `into` is rax
    or rdx, neither of which holds a site's register here; rdx holds the region where
    the spec reads memory)."""
    if spec.kind == CONSTANT:
        return [f"movabs {into}, {spec.value & (2**64 - 1):#x}"]
    if spec.kind == REGISTER:
        out = frame.register(spec.base, into)
        if spec.shift:
            out.append(f"shr {into}, {spec.shift}")
        return out + _extend(spec.size, spec.signed, into)
    out = frame.register(spec.base, into) if spec.base != NO_SLOT else [f"xor {_low(into)}, {_low(into)}"]
    if spec.index != NO_SLOT:
        out += frame.register(spec.index, "rcx") + [f"imul rcx, rcx, {spec.scale}",
                                                    f"add {into}, rcx"]
    if spec.value:
        out.append(f"add {into}, {spec.value}")
    if spec.kind == LINKED_MEMORY:  # a link-time address: the load bias (rdx: the region)
        out.append(f"add {into}, qword ptr [rdx + {region.OFF_LOAD_BIAS}]")
    elif spec.kind == THREAD_MEMORY:  # %fs: the thread pointer (the TLS ABI's fs:[0]),
        # as bytes: Keystone makes `fs:[0]` RIP-relative
        modrm = {"rax": 0x04, "rdx": 0x14}[into]
        out.append(f".byte 0x64, 0x48, 0x03, {modrm:#x}, 0x25, 0, 0, 0, 0")
    load = {1: f"movzx {_low(into)}, byte ptr [{into}]",
            2: f"movzx {_low(into)}, word ptr [{into}]",
            4: f"mov {_low(into)}, dword ptr [{into}]", 8: f"mov {into}, qword ptr [{into}]"}
    return out + [load[spec.size]] + _extend(spec.size, spec.signed, into)


def _low(register: str) -> str:
    return "e" + register[1:]
