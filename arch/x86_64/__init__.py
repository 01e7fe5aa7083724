"""x86_64 backend: decoding, relocation, branch encoding and trampoline code."""

from urewrite.arch.x86_64.backend import X86_64Backend

__all__ = ["X86_64Backend"]
