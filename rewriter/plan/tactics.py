"""How a plan's window is patched (docs/design.md, "Patch tactics"): each way knows its
name, the window it moves to a trampoline of its own (if any), the bytes it writes over
the original code and the stubs it needs. The segment and the pipeline ask a plan's
`patching` for these, whatever the tactic."""

from __future__ import annotations

from typing import List, Optional, Tuple

from urewrite.arch.base import Backend, Window, value_class

TACTICS = ("jump", "hop", "evict", "pun")  # Plan.tactic, in the order they are tried


class Jump:
    """A jump to the trampoline, written over the window."""
    name = "jump"
    moved = None

    def patches(self, backend: Backend, window: Window, trampoline: int,
                moved_to: Optional[int]) -> List[Tuple[int, bytes]]:
        return [(window.address, backend.site_patch(window, trampoline))]

    def stubs(self, backend: Backend, trampoline: int, moved_to: Optional[int]) -> list:
        return []

    def stub_addresses(self) -> tuple:
        return ()


JUMP = Jump()


@value_class
class Hop:
    """A short jump written at a window, to a landing that holds the jump to the
    trampoline (docs/design.md, "Patch tactics")."""
    landing: int
    evicted: Optional[Window] = None  # a neighbour moved to its own trampoline to free the landing

    @property
    def name(self) -> str:
        return "evict" if self.evicted else "hop"

    @property
    def moved(self) -> Optional[Window]:
        return self.evicted

    def patches(self, backend: Backend, window: Window, trampoline: int,
                moved_to: Optional[int]) -> List[Tuple[int, bytes]]:
        """The hop, the jump of the neighbour evicted to `moved_to` (if any), and the
        landing's jump, last, over that neighbour's filler."""
        patches = [(window.address, backend.hop_patch(window, self.landing))]
        if self.evicted:
            patches.append((self.evicted.address, backend.site_patch(self.evicted, moved_to)))
        landing = Window(self.landing, backend.patch_size, ())
        return patches + [(landing.address, backend.site_patch(landing, trampoline))]

    def stubs(self, backend: Backend, trampoline: int, moved_to: Optional[int]) -> list:
        return []

    def stub_addresses(self) -> tuple:
        return ()


@value_class
class Pun:
    """A jump written over a window shorter than itself, its last bytes the ones after
    the window, left as they are; they say where it goes: a stub there jumps on to the
    trampoline (docs/design.md, "Patch tactics")."""
    patch: bytes  # what replaces the window
    stub: int  # where the jump goes
    # E9Patch's successor eviction: the instructions after the window, moved to a
    # trampoline of their own, reached by a jump (through `successor_stub`) whose first
    # bytes are the ones the punned jump ends in
    successor: Optional[Window] = None
    successor_jump: bytes = b""
    successor_stub: int = 0

    name = "pun"

    @property
    def moved(self) -> Optional[Window]:
        return self.successor

    def patches(self, backend: Backend, window: Window, trampoline: int,
                moved_to: Optional[int]) -> List[Tuple[int, bytes]]:
        """The punned jump, and the successor's jump, whose first bytes it ends in (its
        stubs are written with the stubs)."""
        patches = [(window.address, self.patch)]
        if self.successor:
            jump = backend.site_patch(self.successor, self.successor_stub)
            assert jump.startswith(self.successor_jump)
            patches.append((self.successor.address, jump))
        return patches

    def stubs(self, backend: Backend, trampoline: int, moved_to: Optional[int]) -> list:
        """(address, code) of its stubs: a jump on to the trampoline each."""
        stubs = [(self.stub, _stub(backend, self.stub, trampoline))]
        if self.successor:
            stubs.append((self.successor_stub, _stub(backend, self.successor_stub, moved_to)))
        return stubs

    def stub_addresses(self) -> tuple:
        return tuple(stub for stub in (self.stub, self.successor_stub) if stub)


def _stub(backend: Backend, address: int, trampoline: int) -> bytes:
    """A punned jump's stub: the backend's jump to the trampoline."""
    return backend.site_patch(Window(address, backend.patch_size, ()), trampoline)
