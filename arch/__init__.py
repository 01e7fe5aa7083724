"""Architecture backends. Adding an architecture means adding one folder here."""

from __future__ import annotations

from urewrite.arch.base import Backend

EM_X86_64 = 62
EM_AARCH64 = 183

_MACHINE_NAMES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390", 40: "arm",
                  EM_X86_64: "x86_64", EM_AARCH64: "aarch64", 243: "riscv"}


def machine_name(e_machine: int) -> str:
    return _MACHINE_NAMES.get(e_machine, f"machine {e_machine}")


def backend_for(e_machine: int):
    """The backend for an ELF e_machine value, or None when there is none."""
    if e_machine == EM_X86_64:
        from urewrite.arch.x86_64 import X86_64Backend
        return X86_64Backend()
    if e_machine == EM_AARCH64:
        from urewrite.arch.aarch64 import AArch64Backend
        return AArch64Backend()
    return None


__all__ = ["Backend", "backend_for", "machine_name"]
