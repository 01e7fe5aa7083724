"""A fault in Go code's moved instructions must look to the program as in the original.

A fault in a moved instruction happens at a trampoline's address, which Go's runtime
finds in none of its tables: its signal handler takes the faulting frame for a call
to nowhere, so the traceback loses that frame (or stops at an "unexpected return pc")
and names the caller's line instead, and the `pc=` it prints is the trampoline's.
Where the backend has a fault hook (Backend.fault_hook), the entry of Go's signal
handler (runtime.sigtramp) carries it: it sets such a PC back to the original
instruction's before the handler reads it, as the kernel does for a uprobe's
single step. Windows there are then the hook's alone. Without a hook (no backend
support, no handler, an entry that cannot be patched), a window in Go code (the
functions .gopclntab lists) is refused where it would move a load or store through
anything but the stack pointer, the code's own constants or the goroutine's g, a
division, or a trap: Go's nil checks and bounds checks fault on purpose. cgo's C
functions are not Go code and move as any C code does.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from urewrite.rewriter import go_abi, gopclntab
from urewrite.rewriter.go_runtime import is_go_program
from urewrite.rewriter.plan.results import Plan, Refused
from urewrite.rewriter.selectors import Site
from urewrite.trampolines.arguments import GO_REGISTERS
from urewrite.trampolines.region import KIND_ENTRY

HANDLER = "runtime.sigtramp"  # every signal enters Go here (cgoSigtramp jumps to it)
_UNSET = object()


class GoFaults:
    def __init__(self, model, plan_entry: Callable[[Site], Plan]):
        self.model = model
        self.backend = model.backend
        self.plan_entry = plan_entry  # Windows.window
        self.table = gopclntab.table(model.elf) if is_go_program(model.elf) else None
        self._g_in_register: Dict[int, Optional[bool]] = {}  # function -> (None: not Go)
        self._hook = _UNSET
        self._planning_hook = False

    @property
    def hook(self) -> Optional[Plan]:
        """The plain jump at the entry of Go's signal handler that carries the fault
        hook; None where there is none (then Go code moves no instruction that may
        fault)."""
        if self._hook is _UNSET:
            self._hook = None
            address = self.table.address_of(HANDLER) if self.table is not None and \
                self.backend.translates_faults else None
            fn = next((f for f in self.model.holders(address) if f.address == address),
                      None) if address is not None else None
            if fn is not None:
                self._planning_hook = True
                try:
                    plan = self.plan_entry(Site(fn, fn.address, KIND_ENTRY, HANDLER, HANDLER,
                                                exact=True))
                    self._hook = plan if plan.tactic == "jump" else None
                except Refused:
                    pass
                finally:
                    self._planning_hook = False
        return self._hook

    def in_go_code(self, address: int) -> bool:
        """Whether a function .gopclntab lists holds `address`."""
        if self.table is None:
            return False
        k = int(np.searchsorted(self.table.addresses, address, side="right")) - 1
        return k >= 0 and address < int(self.table.addresses[k]) + int(self.table.sizes[k])

    def problem(self, start: int, end: int) -> Optional[str]:
        """Why the window [start, end) must not move, or None."""
        if self.table is None or self._planning_hook:
            return None
        hook = self.hook
        if hook is not None:
            if start < hook.window.end and hook.window.address < end:
                return (f"its window would cover the fault hook urewrite puts at the entry "
                        f"of Go's signal handler ({HANDLER})")
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
