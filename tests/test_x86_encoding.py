"""x86_64 relocations, checked against Keystone and Capstone (the writer's own encodings:
tests/test_x86_writer.py)."""

import capstone
import keystone
import pytest

from urewrite.arch.x86_64 import relocator
from urewrite.arch.x86_64.backend import X86_64Backend

KS = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
BASE = 0x401000


def keystone_bytes(text: str, address: int = BASE) -> bytes:
    return bytes(KS.asm(text, address)[0])


def relocate_text(text: str, old: int, new: int):
    backend = X86_64Backend()
    code = keystone_bytes(text, old)
    insns = backend.decode(code, old, detail=True)
    out, falls_through = relocator.relocate(insns, new)
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return list(md.disasm(out, new)), falls_through, insns


NEW = 0x7000000


def test_rip_relative_operand_keeps_its_target():
    moved, falls, _ = relocate_text("mov eax, dword ptr [rip + 0x2ffa]; cmp byte ptr [rip + 0x10], 5", BASE, NEW)
    assert falls
    old = keystone_bytes("mov eax, dword ptr [rip + 0x2ffa]; cmp byte ptr [rip + 0x10], 5")
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    before = [i.address + i.size + i.disp for i in md.disasm(old, BASE)]
    after = [i.address + i.size + i.disp for i in moved]
    assert before == after


def test_short_branches_become_rel32_with_the_same_target():
    moved, falls, _ = relocate_text("jne 0x401050; jmp 0x401080", BASE, NEW)
    assert [i.mnemonic for i in moved] == ["jne", "jmp"]
    assert [i.size for i in moved] == [6, 5]
    assert [int(i.op_str, 16) for i in moved] == [0x401050, 0x401080]
    assert not falls


@pytest.mark.parametrize("op", ["jrcxz", "loop", "loope", "loopne"])
def test_rel8_only_branches_expand(op):
    moved, falls, _ = relocate_text(f"{op} 0x401040", BASE, NEW)
    assert falls
    assert [i.mnemonic for i in moved] == [op, "jmp", "jmp"]
    taken = int(moved[0].op_str, 16)
    assert taken == moved[2].address  # taken: to the far jump
    assert int(moved[1].op_str, 16) == moved[2].address + moved[2].size  # not taken: past it
    assert int(moved[2].op_str, 16) == 0x401040


def test_call_returns_to_the_original_code():
    moved, falls, insns = relocate_text("push rbx; call 0x402000", BASE, NEW)
    assert not falls
    text = [(i.mnemonic, i.op_str) for i in moved]
    assert text[0] == ("push", "rbx")
    assert ("jmp", "0x402000") == text[-1]
    lea = next(i for i in moved if i.mnemonic == "lea" and "rip" in i.op_str)
    assert lea.address + lea.size + lea.disp == insns[-1].address + insns[-1].size


def test_indirect_call_becomes_jump_through_the_same_operand():
    moved, _, _ = relocate_text("call qword ptr [rip + 0x100]", BASE, NEW)
    last = moved[-1]
    assert last.mnemonic == "jmp"
    assert last.address + last.size + last.disp == BASE + 6 + 0x100


def test_branch_into_the_window_goes_to_the_copy():
    # a loop inside the displaced bytes: jne back to the first instruction
    moved, _, _ = relocate_text("dec ecx; jne 0x401000", BASE, NEW)
    assert int(moved[1].op_str, 16) == NEW


@pytest.mark.parametrize("text, is_last, reason", [
    ("call rax; nop", False, "would return into the displaced bytes"),
    ("call qword ptr [rsp + 8]", True, "relative to the stack pointer"),
    (b"\xc7\xf8\x00\x01\x00\x00", True, "abort target"),  # xbegin (Keystone lacks it)
])
def test_refused_instructions(text, is_last, reason):
    backend = X86_64Backend()
    code = text if isinstance(text, bytes) else keystone_bytes(text)
    insn = backend.decode(code, BASE, detail=True)[0]
    assert reason in relocator.relocation_problem(insn, is_last, shadow_stack=False)


def test_call_refused_under_shadow_stack():
    backend = X86_64Backend()
    insn = backend.decode(keystone_bytes("call 0x402000"), BASE, detail=True)[0]
    assert "shadow stack" in relocator.relocation_problem(insn, True, shadow_stack=True)
    assert relocator.relocation_problem(insn, True, shadow_stack=False) is None


@pytest.mark.parametrize("jump, load", [
    ("jmp rax", "mov rdx, rax"),
    ("jmp r11", "mov rdx, r11"),
    ("jmp qword ptr [rdx + rax*8]", "mov rdx, qword ptr [rdx + rax*8]"),
    ("jmp qword ptr [r12 + 0x10]", "mov rdx, qword ptr [r12 + 0x10]"),  # base r12: no rsp
    ("jmp qword ptr [r13 + r14*8 + 0x1234]", "mov rdx, qword ptr [r13 + r14*8 + 0x1234]"),
    ("jmp qword ptr fs:[rax]", "mov rdx, qword ptr fs:[rax]"),
    ("jmp qword ptr [rsp]", "mov rdx, qword ptr [rsp + 0xa0]"),  # rsp is 160 lower there
    ("jmp qword ptr [rsp + 8]", "mov rdx, qword ptr [rsp + 0xa8]"),
    ("jmp qword ptr [rsp + 0x70]", "mov rdx, qword ptr [rsp + 0x110]"),  # disp8 -> disp32
])
@pytest.mark.parametrize("prefix", [b"", b"\x3e", b"\xf2"], ids=["", "notrack", "bnd"])
def test_an_indirect_jump_target_is_loaded_as_the_jump_reads_it(jump, load, prefix):
    (insn,) = X86_64Backend().decode(prefix + keystone_bytes(jump), BASE, detail=True)
    code = relocator.load_jump_target(insn, BASE + 0x5000, 160)
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    (mov,) = md.disasm(code, BASE + 0x5000)
    assert (f"{mov.mnemonic} {mov.op_str}", mov.size) == (load, len(code))


def test_an_rip_relative_jump_target_is_read_from_the_same_slot():
    for prefix in (b"", b"\x3e"):
        (insn,) = X86_64Backend().decode(prefix + keystone_bytes("jmp qword ptr [rip + 0x100]"),
                                         BASE, detail=True)
        code = relocator.load_jump_target(insn, BASE + 0x5000, 160)
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        (mov,) = md.disasm(code, BASE + 0x5000)
        slot = mov.address + mov.size + int(mov.op_str.split("rip ")[1].replace(" ", "").rstrip("]"), 16)
        assert mov.mnemonic == "mov" and slot == insn.end + 0x100


@pytest.mark.parametrize("text, expected", [
    ("lea rcx, [rip + 5]", BASE + 7 + 5),  # Capstone writes small displacements in decimal
    ("lea rdx, [rip + 0xd73]", BASE + 7 + 0xd73),
    ("lea rdx, [rip - 0x40]", BASE + 7 - 0x40),
    ("mov edx, 0x401234", 0x401234),
    ("movabs rax, 0x7f0012345678", 0x7F0012345678),
    ("mov eax, 3", None),
    ("mov eax, 0xfff", None),
    ("mov ax, 0x1234", 0x1234),
    ("mov rax, -1", 0xFFFFFFFFFFFFFFFF),  # (as the register holds it)
    ("mov dword ptr [rax], 0x401234", None),  # (memory)
    ("mov eax, dword ptr [0x401234]", None),
    ("lea rax, [rbx + 8]", None),
])
def test_computed_addresses(text, expected):
    """What may be the base of offsets to a function's code (planner.windows.case_base)."""
    code = keystone_bytes(text)
    found = X86_64Backend().computed_addresses(code + keystone_bytes("ret"), BASE)
    assert found == ([] if expected is None else [expected])


def test_computed_addresses_stop_at_invalid_code():
    code = keystone_bytes("lea rdx, [rip + 0xd73]") + b"\x06" + keystone_bytes("mov edx, 0x401234")
    assert X86_64Backend().computed_addresses(code, BASE) == [BASE + 7 + 0xd73]
