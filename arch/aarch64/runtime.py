"""Assembles runtime.s for one rewritten file."""

from __future__ import annotations

import dataclasses
import struct

from urewrite.arch import runtime_asm
from urewrite.arch.aarch64 import arguments, direct_entry, trampoline
from urewrite.arch.aarch64.writer import b_imm
from urewrite.arch.base import Runtime, RuntimeSpec
from urewrite.trampolines import program_file, region

# Layout of the process-state memory (see runtime.s): page 0 is cleared in a
# forked child; offsets below are from page 1 (x20).
PS_STARTED = 0
PS_TOO_LONG = 8
PS_TRACE = 16  # ring entries asked for by UREWRITE_TRACE
PS_PROGRAM = 24  # a probe program's mapped .program file (urewrite run), or 0
PS_PROGRAM_MAPS = 32  # and its mapped .maps file
PS_COMM = 40  # the process's name when the program was mapped (16 bytes)
PS_LATENCY = 56  # a byte: 1 when UREWRITE_LATENCY asks for latency
PS_TCB = 64
PS_DIR = 256
DIR_MAX = 4096 - 256 - 1
ENVBUF_PAGES = 256  # 1 MiB at x20 + 8192
# Return-address redirection: the table of per-thread shadow stacks (entries of
# {thread pointer, stack}) after the environment buffer, and each stack's size.
PS_SHADOW_PAGES = 2 + ENVBUF_PAGES  # from x20, in pages
SHADOW_THREADS = 1024  # threads (thread pointers) that can have a shadow stack
SHADOW_DEPTH = 1 << 20  # open redirected calls per thread: more than an 8 MiB stack holds
SHADOW_MAP_SIZE = 16 * (SHADOW_DEPTH + 1)  # depth and a reserved word, then the entries
STATE_SIZE = 4096 + 4096 * PS_SHADOW_PAGES + 16 * SHADOW_THREADS
# lazy_init_aside's stack, in page 0 (x19; cleared in a forked child: nothing on it
# outlives a set-up), and its words
ASIDE_BUSY = 32
ASIDE_SP = ASIDE_BUSY + 8  # (runtime.s reads it there)
ASIDE_BOTTOM = 1024
ASIDE_TOP = 4096
# What a live tracer writes (trampolines/live_note.py): offsets in the state memory
# (page 1, x20, is 4096 bytes in; the file name is at x20 + 4096).
LIVE_STATE = {"region": 0, "setup_lock": 8, "started": 4096 + PS_STARTED,
              "dir_too_long": 4096 + PS_TOO_LONG, "ring_entries": 4096 + PS_TRACE,
              "latency": 4096 + PS_LATENCY,
              "dir": 4096 + PS_DIR, "dir_max": DIR_MAX, "name": 8192}
LOST_MESSAGE = "urewrite: a redirected return address was lost; stopping"
# stack below sp that trace_event_go asks of a goroutine before trace_event runs: more
# than trace_event's deepest path (tests/test_go_stack.py checks it)
TRACE_ROOM = 512

# Registers the runtime's entry points save: x0-x25, x30 and the flags.
_SAVED = list(range(26))
FRAME = 8 * (len(_SAVED) + 2)


def _save_all() -> str:
    lines = [f"    sub sp, sp, #{FRAME}"]
    lines += [f"    stp x{r}, x{r + 1}, [sp, #{8 * r}]" for r in _SAVED[::2]]
    lines += ["    mrs x9, nzcv", f"    stp x30, x9, [sp, #{8 * len(_SAVED)}]"]
    return "\n".join(lines)


def _restore_all() -> str:
    lines = [f"    ldp x30, x9, [sp, #{8 * len(_SAVED)}]", "    msr nzcv, x9"]
    lines += [f"    ldp x{r}, x{r + 1}, [sp, #{8 * r}]" for r in _SAVED[::2]]
    lines += [f"    add sp, sp, #{FRAME}"]
    return "\n".join(lines)


def _unless_shared(spec: RuntimeSpec, reg: str, target: str, a: str, b: str) -> str:
    """In a Go program, the stand-in thread pointer is no thread's identity: Go's
    threads (clone without CLONE_SETTLS) all inherit it, and pure Go never sets
    tpidr_el0. Code that sends `reg` holding it to `target`, as for no thread
    pointer (clobbers `a`, `b` and the flags); nothing for other programs, whose C
    library replaces the stand-in before it starts a thread."""
    if not spec.go_program:
        return ""
    return "\n".join((
        f"    adr {a}, link_table", f"    ldr {b}, [{a}, #8]", f"    add {a}, {a}, {b}",
        f"    add {a}, {a}, #1, lsl #12", f"    add {a}, {a}, #{PS_TCB}",
        f"    cmp {reg}, {a}", f"    b.eq {target}"))


def build(spec: RuntimeSpec) -> Runtime:
    runtime = runtime_asm.assemble(
        "urewrite.arch.aarch64", "runtime.s", "KS_ARCH_ARM64", "KS_MODE_LITTLE_ENDIAN",
        spec, {
            "SAVE_ALL": _save_all(), "RESTORE_ALL": _restore_all(),
            "FRAME": FRAME, "FRAME_PLUS_8": FRAME + 8, "ASIDE_BUSY": ASIDE_BUSY,
            "ASIDE_SP": ASIDE_SP, "ASIDE_BOTTOM": ASIDE_BOTTOM, "ASIDE_TOP": ASIDE_TOP,
            "PS_STARTED": PS_STARTED, "PS_TOO_LONG": PS_TOO_LONG, "PS_TCB": PS_TCB,
            "PS_DIR": PS_DIR, "DIR_MAX": DIR_MAX, "ENVBUF_PAGES": ENVBUF_PAGES,
            "PS_TRACE": PS_TRACE, "PS_LATENCY": PS_LATENCY, "CLOCK_KIND": region.CLOCK_CNTVCT,
            "TRAMPOLINE_FRAME": trampoline.FRAME, "TF_X16": trampoline.FRAME_X16,
            "TF_X0": trampoline.FRAME_X0, "TF_LR": trampoline.FRAME_LR,
            "NO_REGISTER": arguments.NONE,
            "PS_SHADOW_PAGES": PS_SHADOW_PAGES, "SHADOW_THREADS": SHADOW_THREADS,
            "SHADOW_MASK": SHADOW_THREADS - 1,
            "SHADOW_SHIFT": 64 - (SHADOW_THREADS.bit_length() - 1),
            "SHADOW_DEPTH": f"{SHADOW_DEPTH:#x}",
            "SHADOW_MAP_LOW": f"{SHADOW_MAP_SIZE & 0xFFFF:#x}",
            "SHADOW_MAP_HIGH": f"{SHADOW_MAP_SIZE >> 16:#x}",
            "OFF_RETURNS_MISSED": region.OFF_RETURNS_MISSED,
            "OFF_LATENCY_MISSED": region.OFF_LATENCY_MISSED,
            "LOST_MESSAGE": LOST_MESSAGE, "LOST_MESSAGE_SIZE": len(LOST_MESSAGE) + 1,
            "SLOW_HIT_SHARED_TP": _unless_shared(spec, "x17", "sh_shared", "x2", "x3"),
            "THREAD_SHARED_TP": _unless_shared(spec, "x10", "tt_none", "x11", "x12"),
            "SHADOW_SHARED_TP": _unless_shared(spec, "x9", "ss_done", "x10", "x1"),
            "TRACE_ROOM": TRACE_ROOM,
            "PS_PROGRAM": PS_PROGRAM, "PS_PROGRAM_MAPS": PS_PROGRAM_MAPS, "PS_COMM": PS_COMM,
            "DIRECT": direct_entry.DIRECT, "DIRECT_AT": program_file.DIRECT_AT,
        }, lambda source, target: b_imm(source, target).to_bytes(4, "little"))
    # arm64_exports: three quads just before the shared table of entry points at the end
    at = len(runtime.code) - 8 * len(runtime_asm.EXPORTS) - 24
    trace_event_go, shadow_push, shadow_pop = struct.unpack_from("<3Q", runtime.code, at)
    return dataclasses.replace(runtime, shadow_push=shadow_push, shadow_pop=shadow_pop,
                               trace_event_go=trace_event_go)
