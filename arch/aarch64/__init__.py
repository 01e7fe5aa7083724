"""AArch64 backend: decoding, relocation, branch encoding and trampoline code."""

from urewrite.arch.aarch64.backend import AArch64Backend

__all__ = ["AArch64Backend"]
