"""The hand-encoded x86_64 instructions and relocations, checked against Keystone and Capstone."""

import capstone
import keystone
import pytest

from urewrite.arch.x86_64 import relocator
from urewrite.arch.x86_64.backend import X86_64Backend
from urewrite.arch.x86_64.writer import Writer

KS = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
BASE = 0x401000


def keystone_bytes(text: str, address: int = BASE) -> bytes:
    return bytes(KS.asm(text, address)[0])


@pytest.mark.parametrize("emit, text", [
    (lambda w: w.lea_rsp(-128), "lea rsp, [rsp - 128]"),
    (lambda w: w.lea_rsp(128), "lea rsp, [rsp + 128]"),
    (lambda w: w.push("rdx"), "push rdx"),
    (lambda w: w.pop("rcx"), "pop rcx"),
    (lambda w: w.pushfq(), "pushfq"),
    (lambda w: w.popfq(), "popfq"),
    (lambda w: w.movabs_rdx(0x9E3779B97F4A7C15), "movabs rdx, 0x9E3779B97F4A7C15"),
    (lambda w: w.imul_rdx_rcx(), "imul rdx, rcx"),
    (lambda w: w.shr_rdx(52), "shr rdx, 52"),
    (lambda w: w.and_edx(0xFF0), "and edx, 0xff0"),
    (lambda w: w.cmp_rax_rdx_disp_rcx(0x1240), "cmp qword ptr [rax + rdx + 0x1240], rcx"),
    (lambda w: w.mov_rdx_rax_rdx_disp(0x1248), "mov rdx, qword ptr [rax + rdx + 0x1248]"),
    (lambda w: w.mov_esi_imm(0x88), "mov esi, 0x88"),
    (lambda w: w.mov_rsp_disp_rax(8), "mov qword ptr [rsp + 8], rax"),
    (lambda w: w.lea_rcx_rcx(-1), "lea rcx, [rcx - 1]"),
    (lambda w: w.lea_rdx_rcx(1), "lea rdx, [rcx + 1]"),
    (lambda w: w.seto_al(), "seto al"),
    (lambda w: w.lahf(), "lahf"),
    (lambda w: w.sahf(), "sahf"),
    (lambda w: w.add_al_7f(), "add al, 0x7f"),
    (lambda w: w.test_rdx_rdx(), "test rdx, rdx"),
    (lambda w: w.cmp_rdx_imm8(1), "cmp rdx, 1"),
    (lambda w: w.movabs_rsi(0x9E3779B97F4A7C15), "movabs rsi, 0x9E3779B97F4A7C15"),
    (lambda w: w.imul_rsi_rcx(), "imul rsi, rcx"),
    (lambda w: w.shr_rsi(51), "shr rsi, 51"),
    (lambda w: w.and_esi(0x1FE0), "and esi, 0x1fe0"),
    (lambda w: w.cmp_rdx_rsi_disp_rcx(0x1240), "cmp qword ptr [rdx + rsi + 0x1240], rcx"),
    (lambda w: w.mov_rsi_rdx_rsi_disp(0x1248), "mov rsi, qword ptr [rdx + rsi + 0x1248]"),
    (lambda w: w.inc_rsi_disp(0x18), "add qword ptr [rsi + 0x18], 1"),
    (lambda w: w.mov_rax_rdx(), "mov rax, rdx"),
    (lambda w: w.mov_rdx_rsi(), "mov rdx, rsi"),
    (lambda w: w.push_r(12), "push r12"),
    (lambda w: w.pop_r(9), "pop r9"),
    (lambda w: w.push_r(3), "push rbx"),
    (lambda w: w.mov_rdi_rsp(), "mov rdi, rsp"),
    (lambda w: w.lea_rcx_rsp(0x100), "lea rcx, [rsp + 0x100]"),
    (lambda w: w.mov_rcx_rsp_disp(8), "mov rcx, qword ptr [rsp + 8]"),
    (lambda w: w.sub_rdx_rcx(), "sub rdx, rcx"),
    (lambda w: w.add_rdx_rcx(), "add rdx, rcx"),
    (lambda w: w.cmp_rdx_imm32(0x12345), "cmp rdx, 0x12345"),
])
def test_fixed_encodings_match_keystone(emit, text):
    w = Writer(BASE)
    emit(w)
    # Keystone may pick a shorter form for some; compare decoded meaning then.
    ours = w.bytes()
    theirs = keystone_bytes(text)
    if ours != theirs:
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        a = [(i.mnemonic, i.op_str) for i in md.disasm(ours, BASE)]
        b = [(i.mnemonic, i.op_str) for i in md.disasm(theirs, BASE)]
        assert a == b and len(a) == 1


def test_thread_pointer_load():
    w = Writer(BASE)
    w.mov_rcx_fs0()
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    (insn,) = md.disasm(w.bytes(), BASE)
    assert (insn.mnemonic, insn.op_str) == ("mov", "rcx, qword ptr fs:[0]")


def test_flag_free_disarmed_branch():
    w = Writer(BASE)
    w.jrcxz_short(5)
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    (insn,) = md.disasm(w.bytes(), BASE)
    assert (insn.mnemonic, int(insn.op_str, 16)) == ("jrcxz", BASE + 7)


def test_add_one_to_thread_row():
    w = Writer(BASE)
    w.inc_rdx_disp(0x18)
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    (insn,) = md.disasm(w.bytes(), BASE)
    assert (insn.mnemonic, insn.op_str) == ("add", "qword ptr [rdx + 0x18], 1")


def test_rip_relative_and_branches_reach_their_targets():
    w = Writer(BASE)
    w.cmp_rip_qword_imm8(0x500000, 1)
    w.mov_reg_rip("rax", 0x500008)
    w.lea_reg_rip("rax", 0x400123)
    w.jcc("e", 0x402000)
    w.jmp("end")
    w.call(0x403000)
    w.label("end")
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    insns = list(md.disasm(w.bytes(), BASE))
    assert [i.mnemonic for i in insns] == ["cmp", "mov", "lea", "je", "jmp", "call"]
    rip_targets = [i.address + i.size + i.disp for i in insns[:3]]
    assert rip_targets == [0x500000, 0x500008, 0x400123]
    assert int(insns[3].op_str, 16) == 0x402000
    assert int(insns[4].op_str, 16) == insns[5].address + insns[5].size
    assert int(insns[5].op_str, 16) == 0x403000


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
