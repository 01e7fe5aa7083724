"""Whether a function's return address may be redirected: the return-probe fallback.

When some exit of a function cannot be patched, its entry can instead replace the
return address with a stub's, keeping the original on a per-thread shadow stack
(docs/design.md). That is only sound where nothing but the function's own `ret`
uses the return address, so redirection is refused:
- in a file that enables a hardware shadow stack (CET, arm64's Guarded Control
  Stack): it still holds the original address, and a return to the stub stops
  the process;
- in a file that can throw C++ exceptions (or unwind Rust panics): an unwinder
  reads the stub's address as the caller's and finds no frame there
  (std::terminate); in a file that switches
  stacks (ucontext, Boost.Context): the shadow stack is per thread, not per stack;
- at the entry point (the kernel enters it with no return address), and in a
  .cold part (entered by a jump from its function);
- in a function that may return twice (setjmp, vfork, getcontext): the second
  return would find no redirected address;
- in a function whose .eh_frame entry does not show, at its first address, the
  frame a call makes: a symbol inside another function, hand-written code without
  CFI, or a part split off by the compiler (a .cold part, with its own FDE but
  entered by a jump inside its parent's frame) may be reached with anything on top
  of the stack;
- in a function that reads its return address, and on an instruction set without
  redirection (the backend says).
"""

from __future__ import annotations

from typing import Optional

from urewrite.arch.base import Backend
from urewrite.rewriter import eh_frame
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import Function

# Names whose presence among a file's symbols means C++ exceptions can be thrown in it.
# (rust_eh_personality: Rust's panics unwind too; _Unwind_RaiseException itself is
# no sign: static glibc programs carry the unwinder for pthread_exit.)
_THROWING = (b"__cxa_throw", b"__cxa_rethrow", b"__gxx_personality_v0",
             b"rust_eh_personality")
# ... or that it switches stacks (ucontext, Boost.Context): a frame suspended on one
# stack while another returns below it would lose its entry.
_SWITCHING = (b"swapcontext", b"setcontext", b"makecontext", b"jump_fcontext",
              b"make_fcontext", b"ontop_fcontext")
_RETURNS_TWICE = frozenset((
    "setjmp", "_setjmp", "__setjmp", "sigsetjmp", "__sigsetjmp", "savectx", "vfork", "__vfork",
    "__libc_vfork", "getcontext", "__getcontext", "swapcontext", "__swapcontext"))


def file_problem(elf: ElfFile, backend: Backend) -> Optional[str]:
    """Why no function of this file may have its return address redirected, or None."""
    if not backend.redirects_returns:
        return backend.return_redirect_problem(b"", elf.entry)
    if elf.shadow_stack:
        return (f"the file enables {backend.shadow_stack_name}, which stops the process at a "
                f"return to a redirected address")
    for name in (".dynstr", ".strtab"):
        section = elf.section_named(name)
        if section is None or section.type == 8:  # SHT_NOBITS
            continue
        strings = elf.data[section.offset:section.offset + section.size]
        if any(b"\0" + symbol + b"\0" in strings for symbol in _THROWING):
            return ("the file can throw C++ exceptions (or unwind Rust "
                    "panics), and an unwinder cannot pass a redirected return address")
        if any(b"\0" + symbol + b"\0" in strings for symbol in _SWITCHING):
            return ("the file switches stacks (ucontext or Boost.Context), and a frame "
                    "suspended on another stack could lose its redirected address")
    return None


def entry_frames(elf: ElfFile) -> Optional[dict]:
    """FDE start -> its frame there (eh_frame.entry_frames); None when .eh_frame
    cannot be read."""
    try:
        return eh_frame.entry_frames(elf)
    except eh_frame.UnsupportedEncoding:
        return None


def function_problem(elf: ElfFile, backend: Backend, fn: Function,
                     frames: Optional[dict]) -> Optional[str]:
    """Why this function's return address may not be redirected, or None. `frames`:
    entry_frames(elf)."""
    if elf.is_executable and fn.address == elf.entry:
        return "it is the entry point, entered with no return address"
    if frames is None:
        return "the file's .eh_frame cannot be read, to show it is entered by a call"
    if fn.address not in frames:
        return "no .eh_frame entry starts at it, to show it is entered by a call"
    if frames[fn.address] is None:
        return "its unwind rules at its start are beyond this reader, to show it is " \
               "entered by a call"
    if not backend.is_call_frame(frames[fn.address]):
        return ("it starts inside another function's frame (a part split off by the "
                "compiler, entered by a jump): there is no return address on top")
    if ".cold" in fn.name:
        return "it is a part of another function, entered by a jump"
    twice = next((name for name in fn.names if name in _RETURNS_TWICE), None)
    if twice:
        return f"{twice} may return twice, and a second return would find no redirected address"
    if not fn.size:
        return "its size is unknown"
    return backend.return_redirect_problem(elf.read(fn.address, fn.size), fn.address)
