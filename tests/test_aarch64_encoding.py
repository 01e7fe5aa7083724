"""The hand-encoded AArch64 instructions and relocations, checked against Keystone and Capstone.

Keystone assembles branches to a number inconsistently when given a base
address (b/bl/ldr take it as an absolute target, b.cond/cbz/tbz as an offset),
so branch-like encodings are compared with Keystone at address 0, where the
two readings agree, and their absolute targets are checked by decoding our
bytes with Capstone at the real address.
"""

import re
import struct

import capstone
import keystone
import pytest

from urewrite.arch.aarch64 import relocator
from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.aarch64.writer import LR, SP, XZR, Writer, adrp_imm, b_imm
from urewrite.arch.base import Window

KS = keystone.Ks(keystone.KS_ARCH_ARM64, keystone.KS_MODE_LITTLE_ENDIAN)
CS = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
BASE = 0x41234340  # not page-aligned, so that adrp's page arithmetic matters
NOP = 0xD503201F
BACKEND = AArch64Backend()


def keystone_bytes(text: str, address: int = 0) -> bytes:
    return bytes(KS.asm(text, address)[0])


def disasm(code: bytes, address: int = BASE) -> list:
    out = [(i.mnemonic, i.op_str) for i in CS.disasm(code, address)]
    assert len(out) * 4 == len(code), f"{code.hex()} does not decode whole: {out}"
    return out


def emitted(emit, address: int = BASE) -> bytes:
    w = Writer(address)
    emit(w)
    return w.bytes()


# -- fixed encodings: byte for byte against Keystone ---------------------------------------------

FIXED = [
    ("br x16", lambda w: w.br(16), "br x16"),
    ("br x30", lambda w: w.br(LR), "br x30"),
    ("add_imm small", lambda w: w.add_imm(0, 1, 0x123), "add x0, x1, #0x123"),
    ("add_imm max small", lambda w: w.add_imm(2, 3, 0xFFF), "add x2, x3, #0xfff"),
    ("add_imm sp", lambda w: w.add_imm(SP, SP, 16), "add sp, sp, #16"),
    ("add_imm zero", lambda w: w.add_imm(0, 1, 0), "add x0, x1, #0, lsl #12"),
    ("add_imm lsl 12", lambda w: w.add_imm(0, 16, 0x5000), "add x0, x16, #5, lsl #12"),
    ("add_imm lsl 12 max", lambda w: w.add_imm(17, 17, 0xFFF000), "add x17, x17, #0xfff, lsl #12"),
    ("add_imm two", lambda w: w.add_imm(0, 1, 0x123456),
     "add x0, x1, #0x123, lsl #12; add x0, x0, #0x456"),
    ("add_imm two max", lambda w: w.add_imm(5, 5, 0xFFFFFF),
     "add x5, x5, #0xfff, lsl #12; add x5, x5, #0xfff"),
    ("sub_imm", lambda w: w.sub_imm(17, 16, 1), "sub x17, x16, #1"),
    ("sub_imm max", lambda w: w.sub_imm(SP, SP, 0xFFF), "sub sp, sp, #0xfff"),
    ("mul", lambda w: w.mul(0, 17, 0), "mul x0, x17, x0"),
    ("mul high regs", lambda w: w.mul(29, 30, 28), "mul x29, x30, x28"),
    ("lsr", lambda w: w.lsr(0, 0, 52), "lsr x0, x0, #52"),
    ("lsr 1", lambda w: w.lsr(3, 9, 1), "lsr x3, x9, #1"),
    ("lsr 63", lambda w: w.lsr(1, 2, 63), "lsr x1, x2, #63"),
    ("and_mask slot mask", lambda w: w.and_mask(0, 0, 0xFF0), "and x0, x0, #0xff0"),
    ("and_mask low bit", lambda w: w.and_mask(1, 2, 1), "and x1, x2, #1"),
    ("and_mask 32 ones", lambda w: w.and_mask(1, 2, 0xFFFFFFFF), "and x1, x2, #0xffffffff"),
    ("and_mask top byte", lambda w: w.and_mask(3, 4, 0xFF << 56), "and x3, x4, #0xff00000000000000"),
    ("and_mask top bit", lambda w: w.and_mask(3, 4, 1 << 63), "and x3, x4, #0x8000000000000000"),
    ("and_mask 62 ones", lambda w: w.and_mask(5, 6, (1 << 63) - 2), "and x5, x6, #0x7ffffffffffffffe"),
    ("mov", lambda w: w.mov(16, 5), "mov x16, x5"),
    ("mov lr", lambda w: w.mov(0, LR), "mov x0, x30"),
    ("mov xzr", lambda w: w.mov(16, XZR), "mov x16, xzr"),
    ("mov_imm small", lambda w: w.mov_imm(0, 0x88), "movz x0, #0x88"),
    ("mov_imm zero", lambda w: w.mov_imm(7, 0), "movz x7, #0"),
    ("mov_imm 16 bits", lambda w: w.mov_imm(0, 0xFFFF), "movz x0, #0xffff"),
    ("mov_imm two", lambda w: w.mov_imm(0, 0x12345678), "movz x0, #0x5678; movk x0, #0x1234, lsl #16"),
    ("mov_imm high only", lambda w: w.mov_imm(2, 0x10000), "movz x2, #0; movk x2, #1, lsl #16"),
    ("mov_imm max", lambda w: w.mov_imm(2, 0xFFFFFFFF), "movz x2, #0xffff; movk x2, #0xffff, lsl #16"),
    ("mrs tpidr_el0", lambda w: w.mrs_tpidr_el0(17), "mrs x17, tpidr_el0"),
    ("mrs tpidr_el0 x0", lambda w: w.mrs_tpidr_el0(0), "mrs x0, tpidr_el0"),
    ("ldr", lambda w: w.ldr(16, 16), "ldr x16, [x16]"),
    ("ldr offset", lambda w: w.ldr(16, 16, 0xFF8), "ldr x16, [x16, #0xff8]"),
    ("ldr max offset", lambda w: w.ldr(1, 2, 0x7FF8), "ldr x1, [x2, #0x7ff8]"),
    ("ldr sp", lambda w: w.ldr(LR, SP, 32), "ldr x30, [sp, #32]"),
    ("str_", lambda w: w.str_(LR, SP, 32), "str x30, [sp, #32]"),
    ("str_ zero", lambda w: w.str_(0, 1), "str x0, [x1]"),
    ("str_ max offset", lambda w: w.str_(3, 4, 0x7FF8), "str x3, [x4, #0x7ff8]"),
    ("stp_pre", lambda w: w.stp_pre(16, 17, SP, -48), "stp x16, x17, [sp, #-48]!"),
    ("stp_pre min", lambda w: w.stp_pre(0, 1, SP, -512), "stp x0, x1, [sp, #-512]!"),
    ("stp_pre positive", lambda w: w.stp_pre(0, 1, 2, 504), "stp x0, x1, [x2, #504]!"),
    ("stp", lambda w: w.stp(0, 1, SP, 16), "stp x0, x1, [sp, #16]"),
    ("stp negative", lambda w: w.stp(29, LR, 3, -16), "stp x29, x30, [x3, #-16]"),
    ("stp zero", lambda w: w.stp(29, LR, SP, 0), "stp x29, x30, [sp]"),
    ("ldp", lambda w: w.ldp(1, 0, 0), "ldp x1, x0, [x0]"),
    ("ldp offset", lambda w: w.ldp(0, 1, SP, 16), "ldp x0, x1, [sp, #16]"),
    ("ldp negative", lambda w: w.ldp(2, 3, 4, -512), "ldp x2, x3, [x4, #-512]"),
    ("ldp_post", lambda w: w.ldp_post(16, 17, SP, 48), "ldp x16, x17, [sp], #48"),
    ("ldp_post max", lambda w: w.ldp_post(16, 17, SP, 504), "ldp x16, x17, [sp], #504"),
    ("ldp_post negative", lambda w: w.ldp_post(5, 6, 7, -16), "ldp x5, x6, [x7], #-16"),
    ("ldxr", lambda w: w.ldxr(1, 0), "ldxr x1, [x0]"),
    ("ldxr sp", lambda w: w.ldxr(9, SP), "ldxr x9, [sp]"),
    ("stxr", lambda w: w.stxr(17, 1, 0), "stxr w17, x1, [x0]"),
    ("stxr other", lambda w: w.stxr(3, 4, 5), "stxr w3, x4, [x5]"),
    ("add_reg", lambda w: w.add_reg(0, 0, 16), "add x0, x0, x16"),
    ("add_reg other", lambda w: w.add_reg(3, 29, 30), "add x3, x29, x30"),
    ("sub_reg", lambda w: w.sub_reg(1, 1, 17), "sub x1, x1, x17"),
    ("sub_reg other", lambda w: w.sub_reg(30, 2, 3), "sub x30, x2, x3"),
    ("word", lambda w: w.word(NOP), "nop"),
    ("raw", lambda w: w.raw(keystone_bytes("nop; ret")), "nop; ret"),
    ("quad", lambda w: w.quad(0x9E3779B97F4A7C15), ".quad 0x9E3779B97F4A7C15"),
]


@pytest.mark.parametrize("emit, text", [pytest.param(e, t, id=name) for name, e, t in FIXED])
def test_fixed_encodings_match_keystone(emit, text):
    assert emitted(emit).hex() == keystone_bytes(text, BASE).hex()


def test_fixed_encodings_disassemble_as_written():
    """Capstone reads our words back as the instructions meant (a second opinion)."""
    assert disasm(emitted(lambda w: w.stp_pre(16, 17, SP, -48))) == [("stp", "x16, x17, [sp, #-0x30]!")]
    assert disasm(emitted(lambda w: w.ldp_post(16, 17, SP, 48))) == [("ldp", "x16, x17, [sp], #0x30")]
    assert disasm(emitted(lambda w: w.and_mask(0, 0, 0xFF0))) == [("and", "x0, x0, #0xff0")]
    assert disasm(emitted(lambda w: w.mrs_tpidr_el0(17))) == [("mrs", "x17, tpidr_el0")]
    assert disasm(emitted(lambda w: w.stxr(17, 1, 0))) == [("stxr", "w17, x1, [x0]")]
    assert disasm(emitted(lambda w: w.add_imm(0, 1, 0x123456))) == [
        ("add", "x0, x1, #0x123, lsl #12"), ("add", "x0, x0, #0x456")]


def test_add_imm_too_large_is_refused():
    with pytest.raises(OverflowError):
        Writer(BASE).add_imm(0, 0, 1 << 24)


# -- branches and PC-relative encodings ---------------------------------------------------------

def _branch_target(op_str: str) -> int:
    return int(op_str.rsplit("#", 1)[1], 16)


BRANCHES = [
    # name, emit(w, target), Keystone text at address 0 for a target `delta` bytes away, mnemonic
    ("b", lambda w, t: w.b(t), "b #{d}", "b"),
    ("bl", lambda w, t: w.bl(t), "bl #{d}", "bl"),
    ("b.eq", lambda w, t: w.b_cond("eq", t), "b.eq #{d}", "b.eq"),
    ("b.ne", lambda w, t: w.b_cond("ne", t), "b.ne #{d}", "b.ne"),
    ("b.hs", lambda w, t: w.b_cond("hs", t), "b.hs #{d}", "b.hs"),
    ("b.lo", lambda w, t: w.b_cond("lo", t), "b.lo #{d}", "b.lo"),
    ("b.gt", lambda w, t: w.b_cond("gt", t), "b.gt #{d}", "b.gt"),
    ("b.le", lambda w, t: w.b_cond("le", t), "b.le #{d}", "b.le"),
    ("cbz x", lambda w, t: w.cbz(17, t), "cbz x17, #{d}", "cbz"),
    ("cbz w", lambda w, t: w.cbz(3, t, wide=False), "cbz w3, #{d}", "cbz"),
    ("cbnz x", lambda w, t: w.cbnz(1, t), "cbnz x1, #{d}", "cbnz"),
    ("cbnz w", lambda w, t: w.cbnz(17, t, wide=False), "cbnz w17, #{d}", "cbnz"),
    ("ldr_literal", lambda w, t: w.ldr_literal(0, t), "ldr x0, #{d}", "ldr"),
    ("adr", lambda w, t: w.adr(5, t), "adr x5, #{d}", "adr"),
    ("tbnz 63", lambda w, t: w.tbnz(1, 63, t), "tbnz x1, #63, #{d}", "tbnz"),
    ("tbnz 3", lambda w, t: w.tbnz(17, 3, t), "tbnz w17, #3, #{d}", "tbnz"),
]
SHORT_DELTAS = [0, 4, -4, 0x100, -0x100, 0xFFFFC, -0x100000]  # imm19: +-1 MiB
LONG_DELTAS = SHORT_DELTAS + [0x7FFFFFC, -0x8000000, 0x1234568]  # imm26: +-128 MiB


def _cases():
    for name, emit, text, mnemonic in BRANCHES:
        deltas = LONG_DELTAS if name in ("b", "bl") else SHORT_DELTAS
        if name == "adr":
            deltas = [0, 1, -1, 3, 0xFFFFF, -0x100000, 0x1001]
        if name.startswith("tbnz"):  # imm14: +-32 KiB
            deltas = [0, 4, -4, 0x100, -0x100, 0x7FFC, -0x8000]
        for d in deltas:
            yield pytest.param(emit, text, mnemonic, d, id=f"{name}{d:+#x}")


@pytest.mark.parametrize("emit, text, mnemonic, delta", list(_cases()))
def test_branch_encodings(emit, text, mnemonic, delta):
    ours = emitted(lambda w: emit(w, BASE + delta))
    # bytes: Keystone at address 0, where an absolute target is the offset
    assert ours.hex() == keystone_bytes(text.format(d=hex(delta)), 0).hex()
    # meaning: Capstone at the real address names the real target
    [(mn, ops)] = disasm(ours)
    assert mn == mnemonic
    assert _branch_target(ops) == BASE + delta
    if mnemonic in ("cbz", "cbnz"):
        assert ops.split(",")[0] in ("x17", "w3", "x1", "w17")


@pytest.mark.parametrize("cond", ["eq", "ne", "hs", "lo", "mi", "pl", "vs", "vc", "hi", "ls",
                                  "ge", "lt", "gt", "le", "al"])
def test_every_condition_code(cond):
    ours = emitted(lambda w: w.b_cond(cond, BASE + 0x40))
    assert ours == keystone_bytes(f"b.{cond} #0x40", 0)
    assert disasm(ours) == [(f"b.{cond}", f"#{BASE + 0x40:#x}")]


@pytest.mark.parametrize("delta", [0, 0x1000, -0x1000, 0x12345678, -0x40000000, 0xCB00,
                                   0xFFFFF000 - (BASE & ~0xFFF), 0x7FFFF000])
def test_adrp(delta):
    target = BASE + delta
    ours = emitted(lambda w: w.adrp(9, target))
    page = target & ~0xFFF
    assert disasm(ours) == [("adrp", f"x9, #{page:#x}")]
    assert ours == keystone_bytes(f"adrp x9, #{page:#x}", BASE)
    assert struct.unpack("<I", ours)[0] == adrp_imm(9, BASE, target)


@pytest.mark.parametrize("target", [BASE + 0x1000000 + 0x123, BASE - 0x40000000 + 0xFF8, BASE,
                                    (BASE & ~0xFFF) + 0x2000, 0xFFFFFFFF, 0x1008])
def test_address_of(target):
    ours = emitted(lambda w: w.address_of(3, target))
    lo = target & 0xFFF
    add = f"add x3, x3, #{lo:#x}" if lo else "add x3, x3, #0, lsl #12"
    assert ours == keystone_bytes(f"adrp x3, #{target & ~0xFFF:#x}; {add}", BASE)
    assert evaluate(ours, BASE).regs["x3"] == target


def test_labels_resolve_forward_and_backward():
    w = Writer(BASE)
    w.label("top")
    w.cbz(16, "end")  # BASE
    w.ldr_literal(0, "data")  # BASE + 4
    w.b_cond("ne", "top")  # BASE + 8
    w.cbnz(17, "top", wide=False)  # BASE + 12
    w.b("end")  # BASE + 16
    w.bl("top")  # BASE + 20
    w.adr(1, "data")  # BASE + 24
    w.adrp(2, "data")  # BASE + 28
    w.label("end")
    w.word(NOP)  # BASE + 32
    w.word(NOP)  # BASE + 36
    w.label("data")
    w.quad(0x1122334455667788)  # BASE + 40
    code = w.bytes()
    data = BASE + 40
    expected = [
        ("cbz", f"x16, #{BASE + 32:#x}"), ("ldr", f"x0, #{data:#x}"), ("b.ne", f"#{BASE:#x}"),
        ("cbnz", f"w17, #{BASE:#x}"), ("b", f"#{BASE + 32:#x}"), ("bl", f"#{BASE:#x}"),
        ("adr", f"x1, #{data:#x}"), ("adrp", f"x2, #{data & ~0xFFF:#x}"), ("nop", ""), ("nop", ""),
    ]
    assert [(i.mnemonic, i.op_str) for i in CS.disasm(code[:40], BASE)] == expected
    assert code[40:] == struct.pack("<Q", 0x1122334455667788)


@pytest.mark.parametrize("emit", [
    pytest.param(lambda w: w.b(BASE + (1 << 27)), id="b"),
    pytest.param(lambda w: w.bl(BASE - (1 << 27) - 4), id="bl"),
    pytest.param(lambda w: w.b_cond("eq", BASE + (1 << 20)), id="b.cond"),
    pytest.param(lambda w: w.cbz(0, BASE - (1 << 20) - 4), id="cbz"),
    pytest.param(lambda w: w.cbnz(0, BASE + (1 << 20)), id="cbnz"),
    pytest.param(lambda w: w.ldr_literal(0, BASE + (1 << 20)), id="ldr_literal"),
    pytest.param(lambda w: w.adr(0, BASE + (1 << 20)), id="adr"),
    pytest.param(lambda w: w.adrp(0, BASE + (1 << 32)), id="adrp"),
    pytest.param(lambda w: w.address_of(0, BASE - (1 << 32) - 0x1000), id="address_of"),
])
def test_out_of_reach_is_an_error_not_a_wrong_encoding(emit):
    w = Writer(BASE)
    emit(w)
    with pytest.raises(OverflowError):
        w.bytes()


def test_site_patch_is_one_branch_to_the_trampoline():
    window = Window(BASE, 4, ())
    for trampoline in (BASE + 0x4000000, BASE - 0x100, BASE + (1 << 27) - 4):
        patch = BACKEND.site_patch(window, trampoline)
        assert disasm(patch) == [("b", f"#{trampoline:#x}")]
        assert patch == struct.pack("<I", b_imm(BASE, trampoline))
    assert BACKEND.patch_size == 4


# -- a small evaluator for relocated code ------------------------------------------------------

class Outcome:
    def __init__(self):
        self.regs = {}  # register -> value, for values the code computes
        self.loads = []  # (mnemonic, destination, address)
        self.exit = None  # ("b", target) | ("br", register, value) | ("fall", address)
        self.sp = 0  # net stack movement while running
        self.saved = {}  # stack offset -> register stored there
        self.restored = set()  # registers reloaded from where they were saved
        self.conditional = None  # (mnemonic, operands before the target) of the test taken


_REG = r"[xwsdqv]\d+|sp|xzr|wzr|lr"


def _imm(text: str) -> int:
    return int(text.lstrip("#"), 0)


def evaluate(code: bytes, address: int, taken: bool = False, regs=None) -> Outcome:
    """Follow relocated code from its start: with `taken`, conditional branches are taken.

    Knows the instructions the relocator emits; anything else fails the test.
    """
    insns = [(i.address, i.mnemonic, i.op_str) for i in CS.disasm(code, address)]
    assert len(insns) * 4 == len(code), f"undecodable relocated code {code.hex()}"
    by_address = {a: k for k, (a, _, _) in enumerate(insns)}
    out = Outcome()
    out.regs.update(regs or {})
    k, steps = 0, 0
    while True:
        steps += 1
        assert steps < 100, "relocated code loops"
        if k >= len(insns):
            out.exit = ("fall", address + len(code))
            return out
        at, mn, ops = insns[k]
        args = [a.strip() for a in re.split(r",(?![^\[]*\])", ops)] if ops else []
        nxt = k + 1
        if mn == "adrp":
            out.regs[args[0]] = _imm(args[1])
        elif mn == "add" and len(args) in (3, 4) and args[2].startswith("#"):
            value = _imm(args[2])
            if len(args) == 4:
                assert args[3] == "lsl #12"
                value <<= 12
            out.regs[args[0]] = out.regs[args[1]] + value
        elif mn == "mov" and re.fullmatch(_REG, args[1]):
            out.regs[args[0]] = out.regs.get(args[1], f"<{args[1]}>")
        elif mn in ("ldr", "ldrsw") and re.fullmatch(r"\[x\d+\]", args[1]):
            out.loads.append((mn, args[0], out.regs[args[1][1:-1]]))
            out.regs[args[0]] = f"<loaded {args[0]}>"
        elif mn == "stp" and args[2].endswith("]!"):
            m = re.fullmatch(r"\[sp, #(-?0x[0-9a-f]+|-?\d+)\]!", args[2])
            out.sp += int(m.group(1), 0)
            out.saved[out.sp] = args[0]
            out.saved[out.sp + 8] = args[1]
        elif mn == "ldp" and len(args) == 4 and args[2] == "[sp]":
            assert out.saved.get(out.sp) == args[0] and out.saved.get(out.sp + 8) == args[1], \
                "ldp reloads registers from where they were not saved"
            out.restored |= {args[0], args[1]}
            out.sp += _imm(args[3])
        elif mn == "nop":
            pass
        elif mn == "b" or mn == "bl":
            assert mn == "b", "relocated code must not call (it would change x30 to a trampoline address)"
            target = _imm(args[0])
            if target in by_address:
                nxt = by_address[target]
            else:
                out.exit = ("b", target)
                return out
        elif mn == "br":
            out.exit = ("br", args[0], out.regs.get(args[0]))
            return out
        elif mn.startswith(("b.", "bc.")) or mn in ("cbz", "cbnz", "tbz", "tbnz"):
            out.conditional = (mn, tuple(args[:-1]))
            target = _imm(args[-1])
            if taken:
                if target in by_address:
                    nxt = by_address[target]
                else:
                    out.exit = ("b", target)
                    return out
        else:
            raise AssertionError(f"unexpected instruction in relocated code: {mn} {ops}")
        k = nxt


# -- the relocator ---------------------------------------------------------------------------------

ORIG = 0x4400A24  # where the displaced instruction was
FAR = ORIG + 0x1000000  # where the trampoline runs it
AWAY = [0x1000000, -0x1000000, 0x7F00000]  # trampolines far up, far down, at the edge of b's reach


def reachable(target: int, source: int, bits: int) -> bool:
    return -(1 << (bits - 1)) <= (target - source) >> 2 < 1 << (bits - 1)


def insn_of(text: str, address: int = ORIG):
    """The instruction `text`, as the backend decodes it at `address`.

    Targets in the text are offsets from `address` (Keystone at address 0).
    """
    code = keystone_bytes(text, 0)
    assert len(code) == 4, text
    [insn] = BACKEND.decode(code, address, detail=True)
    return insn


def insn_word(word: int, address: int = ORIG):
    [insn] = BACKEND.decode(struct.pack("<I", word), address, detail=True)
    return insn


def relocate(insn, new: int = FAR):
    code, falls_through = relocator.relocate([insn], new)
    assert len(code) % 4 == 0
    return code, falls_through


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("offset", [0x1234, -0x1234, 0, 4, -4, 0xFFFFF, -0x100000, 1, 0x7F])
def test_adr_computes_the_same_address(offset, away):
    insn = insn_of(f"adr x3, #{offset:#x}")
    code, falls = relocate(insn, ORIG + away)
    assert falls
    out = evaluate(code, ORIG + away)
    assert out.regs == {"x3": ORIG + offset}
    assert out.exit == ("fall", ORIG + away + len(code))


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("pages", [0, 1, -1, 0x12345, -0x4400, 0xFFFFF])
def test_adrp_computes_the_same_page(pages, away):
    rd = 7
    page = (ORIG & ~0xFFF) + (pages << 12)
    insn = insn_word(adrp_imm(rd, ORIG, page))
    assert insn.mnemonic == "adrp" and _branch_target(insn.op_str) == page
    new = ORIG + away
    if abs((page >> 12) - (new >> 12)) >= 1 << 20:
        with pytest.raises(OverflowError):
            relocate(insn, new)
        return
    code, falls = relocate(insn, new)
    assert falls
    out = evaluate(code, new)
    assert out.regs == {"x7": page}
    assert out.exit == ("fall", new + len(code))


LITERALS = [
    # Keystone text (offset from ORIG), load the relocated code must do, its destination
    ("ldr x0, #0x1238", "ldr", "x0"),
    ("ldr x17, #-0x1000", "ldr", "x17"),
    ("ldr x16, #0xffffc", "ldr", "x16"),
    ("ldr x30, #-0x100000", "ldr", "x30"),
    ("ldr w5, #0x88", "ldr", "w5"),
    ("ldr w16, #-0x88", "ldr", "w16"),
    ("ldrsw x9, #0x800", "ldrsw", "x9"),
    ("ldrsw x16, #-0x800", "ldrsw", "x16"),
]
FP_LITERALS = [
    ("ldr s1, #0x40", "s1"),
    ("ldr d2, #-0x40", "d2"),
    ("ldr q3, #0x400", "q3"),
    ("ldr q16, #0xfff0", "q16"),
    ("ldr d31, #-0xff0", "d31"),
]


def _literal_target(text: str) -> int:
    return ORIG + _imm(text.rsplit(" ", 1)[1])


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("text, load, dest", LITERALS)
def test_literal_load_reads_the_same_address(text, load, dest, away):
    insn = insn_of(text)
    code, falls = relocate(insn, ORIG + away)
    assert falls
    out = evaluate(code, ORIG + away)
    assert out.loads == [(load, dest, _literal_target(text))]
    assert out.sp == 0
    assert out.exit == ("fall", ORIG + away + len(code))
    # only the destination register is written (as x<n> while it holds the address)
    assert set(out.regs) <= {dest, "x" + dest[1:]}


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("text, dest", FP_LITERALS)
def test_fp_literal_load_reads_the_same_address_and_keeps_the_scratch_registers(text, dest, away):
    insn = insn_of(text)
    code, falls = relocate(insn, ORIG + away)
    assert falls
    out = evaluate(code, ORIG + away)
    assert out.loads == [("ldr", dest, _literal_target(text))]
    assert out.sp == 0, "the stack pointer moves"
    # any general register used for the address is saved first and reloaded after
    assert set(out.regs) - {dest} <= out.restored
    assert out.exit == ("fall", ORIG + away + len(code))


@pytest.mark.parametrize("text", ["prfm pldl1keep, #0x100", "prfm pstl2strm, #-0x2000"])
def test_prfm_literal_changes_nothing(text):
    code, falls = relocate(insn_of(text))
    assert falls
    out = evaluate(code, FAR)
    # a prefetch is a hint: dropping it, or prefetching the same address, are both right
    ours = disasm(code, FAR)
    assert ours == [("nop", "")] or ours[-1][0] == "prfm"
    assert not out.regs and not out.loads and out.sp == 0


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("offset", [0x100, -0x100, 0x7FFFFFC, -0x4000000, 4, 0])
def test_b_goes_to_the_same_target(offset, away):
    insn = insn_of(f"b #{offset:#x}")
    new = ORIG + away
    target = ORIG + offset
    if not reachable(target, new, 26):
        with pytest.raises(OverflowError):
            relocate(insn, new)
        return
    code, falls = relocate(insn, new)
    assert not falls
    out = evaluate(code, new)
    assert out.exit == ("b", target)
    assert not out.regs


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("offset", [0x100, -0x100, 0x3FFFFFC, -0x4000000, 4])
def test_bl_sets_x30_to_the_original_return_address(offset, away):
    insn = insn_of(f"bl #{offset:#x}")
    if not reachable(ORIG + offset, ORIG + away + 8, 26):
        with pytest.raises(OverflowError):
            relocate(insn, ORIG + away)
        return
    code, falls = relocate(insn, ORIG + away)
    assert not falls
    out = evaluate(code, ORIG + away)
    assert out.regs == {"x30": ORIG + 4}
    assert out.exit == ("b", ORIG + offset)


@pytest.mark.parametrize("reg", ["x0", "x5", "x16", "x17", "x30"])
def test_blr_calls_the_same_register_with_the_original_return_address(reg):
    insn = insn_of(f"blr {reg}")
    code, falls = relocate(insn)
    assert not falls
    out = evaluate(code, FAR, regs={reg: f"<{reg}>"})
    assert out.exit[0] == "br"
    assert out.exit[2] == f"<{reg}>", "branches to another value than the register held"
    assert out.regs["x30"] == ORIG + 4
    # a call through x16/x17 may land on `bti c`
    assert out.exit[1] in ("x16", "x17")


CONDITIONALS = [
    # Keystone text with the target offset from ORIG, mnemonic, operands before the target
    ("b.ne #0x100", "b.ne", ()),
    ("b.eq #-0x100", "b.eq", ()),
    ("b.lt #0xffffc", "b.lt", ()),
    ("b.hi #-0x100000", "b.hi", ()),
    ("b.al #0x40", "b.al", ()),
    ("cbz x3, #0x200", "cbz", ("x3",)),
    ("cbz w4, #-0x200", "cbz", ("w4",)),
    ("cbnz x30, #0xffffc", "cbnz", ("x30",)),
    ("cbnz w16, #-0x100000", "cbnz", ("w16",)),
    ("tbz x3, #33, #0x100", "tbz", ("x3", "#0x21")),
    ("tbz w1, #0, #-0x100", "tbz", ("w1", "#0")),
    ("tbnz w0, #3, #0x7ffc", "tbnz", ("w0", "#3")),
    ("tbnz x17, #63, #-0x8000", "tbnz", ("x17", "#0x3f")),
]


@pytest.mark.parametrize("away", AWAY)
@pytest.mark.parametrize("text, mnemonic, operands", CONDITIONALS)
def test_conditional_branch_keeps_its_test_and_both_targets(text, mnemonic, operands, away):
    insn = insn_of(text)
    target = ORIG + _imm(text.rsplit(" ", 1)[1])
    new = ORIG + away
    if not reachable(target, new + 8, 26):
        with pytest.raises(OverflowError):
            relocate(insn, new)
        return
    code, falls = relocate(insn, new)
    assert not falls
    taken = evaluate(code, new, taken=True)
    assert taken.conditional == (mnemonic, operands)
    assert taken.exit == ("b", target)
    if mnemonic != "b.al":
        not_taken = evaluate(code, new, taken=False)
        assert not_taken.exit == ("b", ORIG + 4)
    assert not taken.regs


PLAIN = [
    "add x0, x1, #4", "stp x29, x30, [sp, #-16]!", "mov x29, sp", "ret", "ret x19",
    "sub sp, sp, #0x40", "ldr x0, [x1, #8]", "str w2, [sp, #12]", "cmp w0, #7", "nop",
    "mrs x0, tpidr_el0", "svc #0", "br x3", "movz x0, #0x1234", "ldp x29, x30, [sp], #16",
    "hint #34", "hint #25", "ldaxr x1, [x2]", "fadd d0, d1, d2", "mul w0, w0, w0",
    "ldr x0, [x1, x2, lsl #3]", "subs w0, w0, #1", "csel x0, x1, x2, eq", "ldr q0, [x2, #16]",
    "add x0, sp, #16", "adds x1, x2, x3", "stp q0, q1, [sp, #-32]!", "ldr x1, [x2], #8",
]


@pytest.mark.parametrize("text", PLAIN)
def test_plain_instructions_are_copied_unchanged(text):
    raw = keystone_bytes(text, 0)
    insn = BACKEND.decode(raw, ORIG, detail=True)[0]
    assert insn.mnemonic != ".word"
    assert BACKEND.relocation_problem(insn, True, False) is None
    for new in (FAR, ORIG - 0x1000000, ORIG + 4):
        code, falls = relocate(insn, new)
        assert code == raw
        assert falls  # the trampoline's jump back after a ret or br is never reached


@pytest.mark.parametrize("word, text", [
    (0xD73F083F, "blraa x1, sp"), (0xD73F0C3F, "blrab x1, sp"),
    (0xD63F081F, "blraaz x0"), (0xD63F0C5F, "blrabz x2"),
])
def test_authenticated_calls_are_refused(word, text):
    insn = insn_word(word)
    assert insn.mnemonic == text.split()[0]
    problem = BACKEND.relocation_problem(insn, True, False)
    assert problem and "authenticated" in problem


@pytest.mark.parametrize("text, mnemonic", [
    ("hint #34", "bti c"), ("hint #36", "bti j"), ("hint #38", "bti jc"),
    ("hint #25", "paciasp"), ("hint #27", "pacibsp"),
])
def test_landing_pads_stay_in_place(text, mnemonic):
    [insn] = BACKEND.decode(keystone_bytes(text, 0), ORIG)
    assert f"{insn.mnemonic} {insn.op_str}".strip() == mnemonic
    assert BACKEND.landing_pad_size(insn) == 4


@pytest.mark.parametrize("text", ["nop", "stp x29, x30, [sp, #-16]!", "hint #32", "hint #29",
                                  "adrp x0, #0x1000", "ret"])
def test_other_first_instructions_are_no_landing_pad(text):
    [insn] = BACKEND.decode(keystone_bytes(text, 0), ORIG)
    assert BACKEND.landing_pad_size(insn) == 0


def test_several_displaced_instructions_relocate_in_order():
    insns = BACKEND.decode(keystone_bytes("adr x1, #0x100; ldr w2, #0x200", 0), ORIG, detail=True)
    insns = [insns[0]] + BACKEND.decode(keystone_bytes("ldr w2, #0x1fc", 0), ORIG + 4, detail=True)
    code, falls = relocator.relocate(insns, FAR)
    assert falls
    out = evaluate(code, FAR)
    assert out.regs["x1"] == ORIG + 0x100
    assert out.loads == [("ldr", "w2", ORIG + 4 + 0x1FC)]


def test_bc_cond_keeps_its_target_or_is_refused():
    insn = insn_word(0x54000010 | (0x40 >> 2) << 5)  # bc.eq ORIG + 0x40
    assert (insn.mnemonic, insn.op_str) == ("bc.eq", f"#{ORIG + 0x40:#x}")
    if BACKEND.relocation_problem(insn, True, False):
        return  # refusing the site is right too
    code, falls = relocate(insn)
    assert evaluate(code, FAR, taken=True).exit == ("b", ORIG + 0x40)
    assert evaluate(code, FAR, taken=False).exit in (("b", ORIG + 4), ("fall", FAR + len(code)))


@pytest.mark.parametrize("word, text", [
    (0x10000000 | (0x44 >> 2) << 5 | 31, "adr xzr"),
    (0x58000000 | (0x48 >> 2) << 5 | 31, "ldr xzr"),
    (0x18000000 | (0x4C >> 2) << 5 | 31, "ldr wzr"),
])
def test_zero_register_destinations_leave_sp_alone(word, text):
    insn = insn_word(word)
    assert f"{insn.mnemonic} {insn.op_str}".startswith(text)
    code, _ = relocate(insn)
    for mnemonic, operands in disasm(code, FAR):
        assert not operands.startswith(("sp,", "wsp,")), f"{mnemonic} {operands} writes sp"
        assert "[sp" not in operands, f"{mnemonic} {operands} reads the stack"
