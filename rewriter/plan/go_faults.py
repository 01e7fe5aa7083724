"""Go code's windows move no instruction that may fault.

A fault in a moved instruction happens at a trampoline's address, which Go's
runtime finds in none of its tables: its signal handler takes the faulting frame
for a call to nowhere, so the traceback loses that frame (or stops at an
"unexpected return pc") and names the caller's line instead, and the `pc=` it
prints, like gdb and a core dump, is the trampoline's. So in Go code (the
functions .gopclntab lists) a window is refused where it would move a load or
store through anything but the stack pointer, the code's own constants or the
goroutine's g (ABIInternal keeps it in a register), a division, or a trap: Go's
nil checks and bounds checks fault on purpose. cgo's C functions are not Go code
and move as any C code does.
"""

from __future__ import annotations

from typing import Dict, Optional

from urewrite.rewriter import go_abi, gopclntab
from urewrite.rewriter.go_runtime import is_go_program
from urewrite.trampolines.arguments import GO_REGISTERS


class GoFaults:
    def __init__(self, model):
        self.model = model
        self.backend = model.backend
        self.table = gopclntab.table(model.elf) if is_go_program(model.elf) else None
        self._g_in_register: Dict[int, Optional[bool]] = {}  # function -> (None: not Go)

    def problem(self, start: int, end: int) -> Optional[str]:
        """Why the window [start, end) must not move in Go code, or None."""
        if self.table is None:
            return None
        g_in_register = self._go_function_at(start)
        if g_in_register is None:
            return None
        for insn in self.backend.decode(self.model.elf.read(start, end - start), start):
            if self.backend.may_fault(insn, g_in_register):
                return (f"it would move `{insn}` of Go code, which may fault: Go's "
                        f"traceback and recover() must see a fault where it lies")
        return None

    def _go_function_at(self, address: int) -> Optional[bool]:
        """Whether the Go function holding `address` keeps g in a register; None
        where no Go function holds it."""
        for fn in self.model.holders(address):
            if fn.address not in self._g_in_register:
                k = self.table.index_at(fn.address)
                self._g_in_register[fn.address] = None if k is None else \
                    go_abi.convention(self.table, fn).name == GO_REGISTERS
            found = self._g_in_register[fn.address]
            if found is not None:
                return found
        return None
