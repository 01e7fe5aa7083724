"""What the fault hooks of both backends share (arch/*/fault_hook.py): the signals
they look at, where siginfo keeps its code, and their table of moved instructions."""

from __future__ import annotations

import struct
from typing import Sequence, Tuple

FAULT_SIGNALS = (11, 7, 8, 4, 5)  # SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP
SI_CODE = 8  # siginfo_t.si_code: above 0 when the kernel reports a fault


def encode(table_at: int, moved: Sequence[Tuple[int, int]]) -> bytes:
    """The table at `table_at`: the count, then (trampoline address, original address)
    of each moved instruction, both as offsets from the table, sorted by the first
    (the hooks search it by halves, comparing signed)."""
    pairs = sorted((at - table_at, original - table_at) for at, original in moved)
    return struct.pack(f"<Q{2 * len(pairs)}q", len(pairs), *(v for p in pairs for v in p))
