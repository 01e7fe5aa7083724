"""What Go's runtime computes or expects at fixed places of a Go program's code.

A patch window must hold no address that anything jumps or returns to after its
first byte. Most such addresses are branches the planner decodes, or return
addresses, which a window only ever holds at its end. Go's runtime makes a few
of its own, from its tables and at run time, where no instruction names them:
- every goroutine returns to runtime.goexit + one instruction quantum (newproc
  writes it under the goroutine's first frame, so the frame above looks called
  from goexit);
- recover() resumes a frame at its call of runtime.deferreturn: the function's
  entry plus the offset .gopclntab records for it (_func.deferreturn);
- a goroutine on the system stack (systemstack, cgo calls) is recorded at
  runtime.systemstack_switch + 8, a place past that function's prologue.
These are branch targets to the planner (through the taken-address index).
Return addresses the runtime records (morestack's of the function that grows
its stack, mcall's, the PC a signal interrupts, which asyncPreempt and
sigpanic return to or report) are return addresses or instruction starts
in the original code: calls a trampoline moves push the original return address.

And two functions the runtime enters by injecting a call at any instruction,
from its signal handler (runtime.asyncPreempt) or a debugger's
(runtime.debugCallV2): every register and flag is live at their entry and at
their return, which a probe there must keep.
"""

from __future__ import annotations

from typing import List, Set, Tuple

import numpy as np

from urewrite.rewriter import gopclntab
from urewrite.rewriter.elf_file import ElfFile

# the runtime's functions entered by an injected call, with every flag live
INJECTED = ("runtime.asyncPreempt", "runtime.debugCallV2", "runtime.debugCallV1")
# the fake PC systemstack leaves in a goroutine's state (asm_amd64.s, asm_arm64.s)
SYSTEMSTACK_SWITCH_PC = 8


GO_SECTIONS = (".go.buildinfo", ".gopclntab")
NT_GO_BUILD_ID = 4  # the "Go" note the Go linker writes (.note.go.buildid)


def is_go_program(elf: ElfFile) -> bool:
    """Whether the file is a Go program: the one place that decides it. Go's linker
    names these sections (kept by `-s -w`), and writes a "Go" build ID note; either
    is enough."""
    if any(elf.section_named(name) is not None for name in GO_SECTIONS):
        return True
    return any(owner == b"Go" and kind == NT_GO_BUILD_ID for owner, kind, _ in elf.notes())


def go_functions(elf: ElfFile) -> frozenset:
    """Entries of the functions .gopclntab lists: Go code (ABIInternal and ABI0
    assembly), whose stack is a goroutine's; cgo's C functions are not listed."""
    go = gopclntab.table(elf)
    return frozenset() if go is None else frozenset(go.addresses.tolist())


def landings(elf: ElfFile) -> List[Tuple[str, np.ndarray]]:
    """(why, addresses) of the places the runtime resumes code at, where no branch
    names them; [] for a file that is no Go program."""
    go = gopclntab.table(elf)
    if go is None:
        return []
    found = []
    goexit = go.address_of("runtime.goexit")
    if goexit is not None:
        found.append((f"Go's runtime (every goroutine returns to runtime.goexit+{go.quantum})",
                      np.array([goexit + go.quantum], dtype=np.int64)))
    switch = go.address_of("runtime.systemstack_switch")
    if switch is not None:
        found.append(("Go's runtime (it records a goroutine on the system stack at "
                      f"runtime.systemstack_switch+{SYSTEMSTACK_SWITCH_PC})",
                      np.array([switch + SYSTEMSTACK_SWITCH_PC], dtype=np.int64)))
    deferring = go.deferreturn != 0
    if deferring.any():
        found.append(("Go's runtime (recover() resumes a function at its call of "
                      "runtime.deferreturn)",
                      go.addresses[deferring] + go.deferreturn[deferring]))
    return found


def injected_entries(elf: ElfFile) -> Set[int]:
    """Entries of the functions the runtime enters by a call injected at any
    instruction: their flags are live at entry and at their returns."""
    go = gopclntab.table(elf)
    if go is None:
        return set()
    return {a for a in map(go.address_of, INJECTED) if a is not None}
