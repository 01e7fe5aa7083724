"""Assembles runtime.s for one rewritten file."""

from __future__ import annotations

from urewrite.arch import runtime_asm
from urewrite.arch.aarch64 import arguments, trampoline
from urewrite.arch.aarch64.writer import b_imm
from urewrite.arch.base import Runtime, RuntimeSpec
from urewrite.trampolines import region

# Layout of the process-state memory (see runtime.s): page 0 is cleared in a
# forked child; offsets below are from page 1 (x20).
PS_STARTED = 0
PS_TOO_LONG = 8
PS_TRACE = 16  # ring entries asked for by UREWRITE_TRACE
PS_TCB = 64
PS_DIR = 256
DIR_MAX = 4096 - 256 - 1
ENVBUF_PAGES = 256  # 1 MiB at x20 + 8192
STATE_SIZE = 4096 + 8192 + ENVBUF_PAGES * 4096

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


def build(spec: RuntimeSpec) -> Runtime:
    return runtime_asm.assemble(
        "urewrite.arch.aarch64", "runtime.s", "KS_ARCH_ARM64", "KS_MODE_LITTLE_ENDIAN",
        spec, {
            "SAVE_ALL": _save_all(), "RESTORE_ALL": _restore_all(),
            "FRAME": FRAME, "FRAME_PLUS_8": FRAME + 8,
            "PS_STARTED": PS_STARTED, "PS_TOO_LONG": PS_TOO_LONG, "PS_TCB": PS_TCB,
            "PS_DIR": PS_DIR, "DIR_MAX": DIR_MAX, "ENVBUF_PAGES": ENVBUF_PAGES,
            "PS_TRACE": PS_TRACE, "CLOCK_KIND": region.CLOCK_CNTVCT,
            "TRAMPOLINE_FRAME": trampoline.FRAME, "TF_X16": trampoline.FRAME_X16,
            "TF_X0": trampoline.FRAME_X0, "TF_LR": trampoline.FRAME_LR,
            "NO_REGISTER": arguments.NONE,
        }, lambda source, target: b_imm(source, target).to_bytes(4, "little"))
