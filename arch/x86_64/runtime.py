"""Assembles runtime.s for one rewritten file."""

from __future__ import annotations

import dataclasses
import struct

from urewrite.arch import runtime_asm
from urewrite.arch.x86_64 import direct_entry, trampoline
from urewrite.trampolines import program_file, region
from urewrite.arch.base import Runtime, RuntimeSpec
from urewrite.arch.x86_64.writer import jmp_rel32

# Layout of the process-state memory (see runtime.s).
PS_STARTED = 4096
PS_DIR_TOO_LONG = 4096 + 8
PS_TRACE = 4096 + 16  # ring entries asked for by UREWRITE_TRACE
PS_LATENCY = 4096 + 25  # a byte: 1 when UREWRITE_LATENCY asks for latency (after FSBASE_USABLE)
PS_PROGRAM = 4096 + 32  # a probe program's mapped .program file (urewrite run), or 0
PS_PROGRAM_MAPS = 4096 + 40  # and its mapped .maps file
PS_COMM = 4096 + 48  # the process's name when the program was mapped (16 bytes)
PS_TCB = 4096 + 64
PS_DIR = 4096 + 256
DIR_MAX = 4096 - 256 - 1
PS_NAME = 8192
PS_ENVBUF = 12288
ENVBUF_SIZE = 1 << 20  # untouched pages cost nothing; a larger environment is read in part
# Return-address redirection: the table of per-thread shadow stacks (entries of
# {thread pointer, stack}) after the environment buffer, and each stack's size.
PS_SHADOW = PS_ENVBUF + ENVBUF_SIZE
SHADOW_THREADS = 1024  # threads (thread pointers) that can have a shadow stack
SHADOW_DEPTH = 1 << 20  # open redirected calls per thread: more than an 8 MiB stack holds
SHADOW_MAP_SIZE = 16 * (SHADOW_DEPTH + 1)  # depth and a reserved word, then the entries
STATE_SIZE = PS_SHADOW + 16 * SHADOW_THREADS
# lazy_init_aside's stack, in page 0 (cleared in a forked child: nothing on it
# outlives a set-up), and its words
ASIDE_BUSY = 64  # (the line after the region word's: the binding fills that one)
ASIDE_SP = 72
ASIDE_BOTTOM = 1024
ASIDE_TOP = 4096
# What a live tracer writes (trampolines/live_note.py): offsets in the state memory.
LIVE_STATE = {"region": 0, "setup_lock": 8, "started": PS_STARTED,
              "dir_too_long": PS_DIR_TOO_LONG, "ring_entries": PS_TRACE, "latency": PS_LATENCY,
              "dir": PS_DIR,
              "dir_max": DIR_MAX, "name": PS_NAME}
LOST_MESSAGE = "urewrite: a redirected return address was lost; stopping"

# What shadow_push saves (the trampoline saved rax, rcx, rdx, rsi), and shadow_pop
# (the registers it and shadow_stack touch when they do not map a stack).
SAVED_PUSH = ("rbx", "rdi", "r8", "r9", "r10", "r11", "r12")
SAVED_POP = ("rax", "rcx", "rdx", "rbx", "rdi", "r8", "r9", "r10", "r11")
# Registers the runtime's entry points save (every one a syscall or our code may touch).
SAVED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "rbx",
         "r12", "r13", "r14", "r15")


def build(spec: RuntimeSpec) -> Runtime:
    runtime = runtime_asm.assemble(
        "urewrite.arch.x86_64", "runtime.s", "KS_ARCH_X86", "KS_MODE_64", spec, {
            "SAVE_ALL": "\n".join(f"    push {r}" for r in SAVED),
            "RESTORE_ALL": "\n".join(f"    pop {r}" for r in reversed(SAVED)),
            "SAVED_BYTES": 8 * len(SAVED),
            "PS_STARTED": PS_STARTED, "PS_DIR_TOO_LONG": PS_DIR_TOO_LONG, "PS_TCB": PS_TCB,
            "PS_DIR": PS_DIR, "DIR_MAX": DIR_MAX, "PS_NAME": PS_NAME,
            "PS_ENVBUF": PS_ENVBUF, "ENVBUF_SIZE": ENVBUF_SIZE, "PS_TRACE": PS_TRACE,
            "PS_LATENCY": PS_LATENCY,
            "PS_PROGRAM": PS_PROGRAM, "DIRECT": direct_entry.DIRECT,
            "DIRECT_AT": program_file.DIRECT_AT, "PS_PROGRAM_MAPS": PS_PROGRAM_MAPS, "PS_COMM": PS_COMM,
            "CLOCK_KIND": region.CLOCK_TSC, "CLOCK_FILE": region.CLOCK_FILE,
            "CLOCK_FILE_MAGIC": hex(int.from_bytes(region.CLOCK_FILE_MAGIC, "little")),
            "FSBASE_USABLE": trampoline.FSBASE_USABLE, "ASIDE_BUSY": ASIDE_BUSY,
            "ASIDE_SP": ASIDE_SP, "ASIDE_BOTTOM": ASIDE_BOTTOM, "ASIDE_TOP": ASIDE_TOP,
            "SAVE_PUSH": "\n".join(f"    push {r}" for r in SAVED_PUSH),
            "RESTORE_PUSH": "\n".join(f"    pop {r}" for r in reversed(SAVED_PUSH)),
            "SAVE_POP": "\n".join(f"    push {r}" for r in SAVED_POP),
            "RESTORE_POP": "\n".join(f"    pop {r}" for r in reversed(SAVED_POP)),
            "SAVED_POP_BYTES": 8 * len(SAVED_POP),
            "PS_SHADOW": PS_SHADOW, "SHADOW_THREADS": SHADOW_THREADS,
            "SHADOW_MASK": SHADOW_THREADS - 1,
            "SHADOW_SHIFT": 64 - (SHADOW_THREADS.bit_length() - 1),
            "SHADOW_DEPTH": SHADOW_DEPTH, "SHADOW_MAP_SIZE": SHADOW_MAP_SIZE,
            "OFF_RETURNS_MISSED": region.OFF_RETURNS_MISSED,
            "OFF_LATENCY_MISSED": region.OFF_LATENCY_MISSED,
            "LOST_MESSAGE": LOST_MESSAGE, "LOST_MESSAGE_SIZE": len(LOST_MESSAGE) + 1,
        }, jmp_rel32)
    # x86_exports: two quads just before the shared table of entry points at the end
    at = len(runtime.code) - 8 * len(runtime_asm.EXPORTS) - 16
    shadow_push, shadow_pop = struct.unpack_from("<2Q", runtime.code, at)
    return dataclasses.replace(runtime, shadow_push=shadow_push, shadow_pop=shadow_pop)
