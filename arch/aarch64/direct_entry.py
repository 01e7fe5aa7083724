"""arm64 direct entries: how a probe's hit reaches its program without the runtime
(the x86_64 module's docstring says why and what; this is the same on AArch64, but
that an entry here saves every register it may need whatever the code writes: no
Backend.registers_written for AArch64, whose speed cannot be measured here, under
qemu).

A trampoline whose process runs a program calls the probe's direct entry from its
trace path (trampoline.py, `_direct_call`), the trampoline's frame on the stack:

    [sp] x16, [sp + 8] x17, [sp + 16] x0, [sp + 24] x1, [sp + 32] x30 of the site;
    the site's sp is sp + 48
    x1 = the point's argument descriptors (trampolines/arguments.py)
    x16 = the binding: the state memory's words at DIRECT (below)
    every other register and the flags as at the site

The entry keeps every register but x0, x1, x16, x17 and x30 (the trampoline reloads
x30), and the flags (nothing on an arm64 hit path may change them); it returns x0 = 0
(done: run, or nothing to run) or 1: the point's arguments are not the ones the
entry was made for, and the trampoline takes the trace path.

The binding, written by the runtime's program_setup (runtime.s), the table last:
    [+0] the direct table (program_file.py), or 0   [+8] this process's maps
    [+16] the printf routine   [+24] thread id routine: x0 = region -> x0
    [+32] thread name routine: x0 = region, x1 = 64 bytes to fill
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from urewrite.arch.aarch64.arguments import NONE, SP_SLOT
from urewrite.arch.aarch64.program_code import _extend, _mov, _sub, condition, float_test
from urewrite.trampolines import program_file as P
from urewrite.trampolines import region
from urewrite.trampolines.arguments import CONSTANT, MEMORY, REGISTER, encode
from urewrite.trampolines.program_file import DirectEntry

DIRECT = 64  # the binding's offset in the state memory's first page (region at 0)
FRAME = 48  # the trampoline's frame
_IN_FRAME = {16: 0, 17: 8, 0: 16, 1: 24, 30: 32}  # site registers the frame holds
_SAVED = [*range(2, 16), 18, 29, 30, 16]  # what the function may change, and the binding
SAVE = 8 * (len(_SAVED) + 2)  # (+ the flags, + the region as checked)
STACK = SAVE + P.CTX_SIZE  # the context at sp, the saved registers above it
_REGION_KEPT = P.CTX_SIZE + 8 * (len(_SAVED) + 1)
# bti c: the trampoline calls an entry through a register, and a program built into a
# BTI-guarded object lies in guarded pages
_BTI = "hint #34"


def assemble(base: int, run_at: int, entries: Sequence[Optional[DirectEntry]]) -> \
        Tuple[bytes, List[int]]:
    """Backend.direct_entries: the entries' code at `base` in the program's code, the
    header's run at `run_at` from the code's start, and where each starts (an entry
    None: one that sends every hit to the trace path)."""
    from urewrite.arch.runtime_asm import assemble_with_starts
    lines = ["d_base:"]
    for k, entry in enumerate(entries):
        lines += [f"d{k}:", _BTI, "mov x0, #1", "ret"] if entry is None else \
            _entry(f"d{k}", entry, run_at - base)
    code, starts = assemble_with_starts("".join(line + "\n" for line in lines),
                                        [f"d{k}" for k in range(len(entries))], base,
                                        "KS_ARCH_ARM64", "KS_MODE_LITTLE_ENDIAN",
                                        "a program's direct entries")
    return code, [start - base for start in starts]


def supported(entry: DirectEntry) -> bool:
    """Whether an entry can read every argument the code reads as its specs say."""
    return all(_readable(spec) for spec in entry.expected[:entry.reads])


def _readable(spec) -> bool:
    slots = range(0, SP_SLOT + 1)
    if spec.kind == CONSTANT:
        return True
    if spec.kind == REGISTER:
        return spec.base in slots and not spec.shift
    if spec.kind == MEMORY:
        return all(s == NONE or s in slots for s in (spec.base, spec.index)) and \
            spec.scale in (1, 2, 4, 8) and -(1 << 31) <= spec.value < 1 << 31
    return False


def _entry(name: str, entry: DirectEntry, run_at: int) -> List[str]:
    out = [f"{name}:", _BTI]
    reads = min(entry.reads, P.ARGUMENTS)
    known = min(reads, len(entry.expected))
    if reads:  # the point's descriptors: those the entry was made for? (no flags set)
        blob = encode(entry.expected)
        out += ["ldr x17, [x1]"] + _differs(len(entry.expected), f"{name}_other")
        for j in range(known):
            for half in (0, 8):
                word = int.from_bytes(blob[8 + 16 * j + half:16 + 16 * j + half], "little")
                out += [f"ldr x17, [x1, #{8 + 16 * j + half}]"] + _differs(word, f"{name}_other")
    if entry.predicate is not None and (len(entry.predicate) == 5 or  # (a register's)
                                        entry.predicate[0] >= known or
                                        entry.expected[entry.predicate[0]].kind != MEMORY):
        out += _predicate(name, entry, known)
    # Each word a tracer may change meanwhile is read once and used as checked: the
    # maps (a re-arm by another run stores its own: this code with those maps would
    # write past them) in x1, then the context; the region (a tracer that disarms the
    # process stores 1 in its word) in x17, then kept in the frame
    out += [f"{name}_run:",
            "ldr x1, [x16, #8]", f"cbz x1, {name}_done",  # its run's maps, or none yet
            "ldr x17, [x1, #8]", "adr x0, d_base"] + _sub("x0", "x0", -run_at) + [
            "ldr x0, [x0]", "sub x0, x0, x17", f"cbnz x0, {name}_done",
            f"ldur x17, [x16, #-{DIRECT}]",
            "sub x0, x17, #1", f"cbz x0, {name}_done", f"cbz x17, {name}_done",
            f"sub sp, sp, #{STACK}"]
    for k in range(0, len(_SAVED) - 1, 2):
        out.append(f"stp x{_SAVED[k]}, x{_SAVED[k + 1]}, [sp, #{P.CTX_SIZE + 8 * k}]")
    out += ["mrs x0, nzcv", f"str x0, [sp, #{P.CTX_SIZE + 8 * len(_SAVED)}]",
            f"str x17, [sp, #{_REGION_KEPT}]", f"str x1, [sp, #{P.CTX_MAPS}]"]
    for j in range(reads):
        if j < known:
            out += _value(entry.expected[j]) + [f"str x0, [sp, #{P.CTX_ARGS + 8 * j}]"]
        else:  # the probe has no such argument: it reads 0
            out.append(f"str xzr, [sp, #{P.CTX_ARGS + 8 * j}]")
    out += [f"ldr x17, [sp, #{_REGION_KEPT}]"]
    if entry.uses & P.USES_PID:  # (pid and the printf routine where the code reads them)
        out += [f"ldr w0, [x17, #{region.OFF_PID}]", f"str x0, [sp, #{P.CTX_PID}]"]
    if entry.uses & P.USES_EVENT:
        out += ["ldr x0, [x16, #16]", f"str x0, [sp, #{P.CTX_EVENT}]"]
    if entry.uses & P.USES_NSECS:  # the region's clock pair, then ticks (x17: region)
        out += ["mrs x0, cntvct_el0",
                f"ldr x1, [x17, #{region.OFF_CLOCK_REF_TICKS}]", "sub x0, x0, x1",
                f"ldr x1, [x17, #{region.OFF_NS_MULT}]",
                "mul x2, x0, x1", "umulh x3, x0, x1", "extr x0, x3, x2, #32",
                f"ldr x1, [x17, #{region.OFF_CLOCK_REF_NS}]", "add x0, x0, x1",
                f"str x0, [sp, #{P.CTX_NSECS}]"]
    saved_x16 = P.CTX_SIZE + 8 * _SAVED.index(16)
    if entry.uses & P.USES_TID:
        out += ["mov x0, x17", "ldr x17, [x16, #24]", "blr x17",
                f"str x0, [sp, #{P.CTX_TID}]", f"ldr x16, [sp, #{saved_x16}]",
                f"ldr x17, [sp, #{_REGION_KEPT}]"]
    if entry.uses & P.USES_COMM:
        out += ["mov x0, x17", f"add x1, sp, #{P.CTX_COMM}", "ldr x17, [x16, #32]", "blr x17",
                f"ldr x16, [sp, #{saved_x16}]"]
    out += ["mov x0, sp", f"bl {entry.function:#x}",
            f"ldr x0, [sp, #{P.CTX_SIZE + 8 * len(_SAVED)}]", "msr nzcv, x0"]
    for k in range(0, len(_SAVED) - 1, 2):
        out.append(f"ldp x{_SAVED[k]}, x{_SAVED[k + 1]}, [sp, #{P.CTX_SIZE + 8 * k}]")
    out += [f"add sp, sp, #{STACK}",
            f"{name}_done:", "mov x0, #0", "ret",
            f"{name}_other:", "mov x0, #1", "ret"]
    return out


def _predicate(name: str, entry: DirectEntry, known: int) -> List[str]:
    """Nothing to do unless arg N OP constant: checked before anything is saved, the
    flags kept in x1 (the descriptors are read by now)."""
    if len(entry.predicate) == 5:  # floating-point register N, as lower's fcompare
        n, place, op, _, kind = entry.predicate
        return [f"fmov x17, d{n}", "mrs x1, nzcv"] + \
            float_test(kind, op, place, "x17", "x0", f"{name}_true", f"{name}_false",
                       f"{name}_nan") + [f"{name}_false:", "msr nzcv, x1", f"b {name}_done",
                                         f"{name}_true:", "msr nzcv, x1"]
    n, constant, op, signed = entry.predicate
    value = _value(entry.expected[n], pushed=0, into="x17") if n < known else ["mov x17, #0"]
    return value + _mov("x0", constant) + [
        "mrs x1, nzcv", "cmp x17, x0", f"b.{condition(op, signed)} {name}_true",
        "msr nzcv, x1", f"b {name}_done", f"{name}_true:", "msr nzcv, x1"]


def _differs(value: int, target: str) -> List[str]:
    """On to `target` unless x17 holds `value` (x0 clobbered; no flags set)."""
    if value == 0:
        return [f"cbnz x17, {target}"]
    return _mov("x0", value) + ["sub x17, x17, x0", f"cbnz x17, {target}"]


def _register(slot: int, into: str, pushed: int) -> List[str]:
    """`into` = the site's register `slot`, with `pushed` bytes below the trampoline's
    frame (x17 may be clobbered)."""
    if slot == NONE:
        return [f"mov {into}, #0"]
    if slot == SP_SLOT:
        return [f"add {into}, sp, #{pushed + FRAME}"]
    if slot in _IN_FRAME:
        return [f"ldr {into}, [sp, #{pushed + _IN_FRAME[slot]}]"]
    return [f"mov {into}, x{slot}"]


def _value(spec, pushed: int = STACK, into: str = "x0") -> List[str]:
    """`into` (x0 or x17) = the argument `spec` describes (x0 and x1 may be clobbered
    too where `into` is x0; only `into` where it is x17, for a register or constant)."""
    if spec.kind == CONSTANT:
        return _mov(into, spec.value)
    if spec.kind == REGISTER:
        return _register(spec.base, into, pushed) + _extend(spec.size, spec.signed, into)
    out = _register(spec.base, "x0", pushed)
    if spec.index != NONE:
        out += _register(spec.index, "x1", pushed) + \
            [f"add x0, x0, x1, lsl #{(spec.scale).bit_length() - 1}"]
    if spec.value:
        out += _mov("x1", spec.value) + ["add x0, x0, x1"]
    load = {1: "ldrb w0, [x0]", 2: "ldrh w0, [x0]", 4: "ldr w0, [x0]", 8: "ldr x0, [x0]"}
    return out + [load[spec.size]] + _extend(spec.size, spec.signed)
