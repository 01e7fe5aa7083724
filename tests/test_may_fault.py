"""Which instructions may fault (Backend.may_fault), on both architectures: Go code's
windows move none of them (rewriter/plan/go_faults.py). Each instruction is
assembled, decoded as the planner decodes it, and asked."""

from __future__ import annotations

import keystone
import pytest

from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.x86_64.backend import X86_64Backend

# (instruction, may fault with g in its register (Go's ABIInternal), without)
X86_64 = [
    ("mov rax, qword ptr [rax + 8]", True, True),  # a method's nil check by its load
    ("test byte ptr [rax], al", True, True),  # Go's explicit nil check
    ("cmp rsp, qword ptr [r14 + 0x10]", False, True),  # the stack check: g's stackguard
    ("mov qword ptr [rsp + 8], rax", False, False),
    ("mov rax, qword ptr [rsp + rcx*8]", True, True),  # an index may reach anywhere
    ("mov rax, qword ptr [rip + 0x100]", False, False),
    ("mov rcx, qword ptr fs:[0xfffffffffffffff8]", False, False),  # Go 1.16's g
    ("mov rcx, qword ptr fs:[rax]", True, True),
    ("lea rax, [rbx + 8]", False, False),
    ("nop dword ptr [rax + rax]", False, False),
    ("prefetcht0 byte ptr [rax]", False, False),
    ("push rbp", False, False),
    ("idiv rcx", True, True),
    ("ud2", True, True),
    ("int3", True, True),
    ("rep movsb byte ptr [rdi], byte ptr [rsi]", True, True),
    ("lock xadd qword ptr [rbx], rax", True, True),
    ("add rax, rbx", False, False),
]
AARCH64 = [
    ("ldr x0, [x0, #8]", True, True),
    ("ldr x16, [x28, #16]", False, True),  # the stack check: g's stackguard
    ("stp x29, x30, [sp, #-16]!", False, False),
    ("ldp x29, x30, [sp], #16", False, False),
    ("str x30, [sp, #-96]!", False, False),
    ("ldr x0, [sp, x1]", True, True),
    ("ldrb w1, [x2, x3, lsl #0]", True, True),
    ("prfm pldl1keep, [x0]", False, False),
    ("brk #0", True, True),
    ("dc zva, x0", True, True),
    ("add x0, x1, #8", False, False),
    ("sdiv x0, x1, x2", False, False),  # arm64 divides by zero without a fault
]


def _decoded(backend, arch, mode, text: str):
    code, _ = keystone.Ks(arch, mode).asm(text, 0x1000)
    (insn,) = backend.decode(bytes(code), 0x1000)
    return insn


@pytest.mark.parametrize("text, with_g, without_g", X86_64)
def test_x86_64(text, with_g, without_g):
    insn = _decoded(X86_64Backend(), keystone.KS_ARCH_X86, keystone.KS_MODE_64, text)
    assert X86_64Backend().may_fault(insn, True) == with_g, insn
    assert X86_64Backend().may_fault(insn, False) == without_g, insn


@pytest.mark.parametrize("text, with_g, without_g", AARCH64)
def test_aarch64(text, with_g, without_g):
    insn = _decoded(AArch64Backend(), keystone.KS_ARCH_ARM64, keystone.KS_MODE_LITTLE_ENDIAN,
                    text)
    assert AArch64Backend().may_fault(insn, True) == with_g, insn
    assert AArch64Backend().may_fault(insn, False) == without_g, insn


def test_permanently_undefined_faults():
    insn = AArch64Backend().decode((0).to_bytes(4, "little"), 0x1000)[0]  # (Keystone has no udf)
    assert insn.mnemonic == "udf", insn
    assert AArch64Backend().may_fault(insn, True)


def test_literal_load_does_not_fault():
    # `ldr x0, <label>`: its own code's constant, which Keystone assembles from a number
    insn = AArch64Backend().decode((0x58000040).to_bytes(4, "little"), 0x1000)[0]
    assert insn.mnemonic == "ldr" and "[" not in insn.op_str
    assert not AArch64Backend().may_fault(insn, False)
