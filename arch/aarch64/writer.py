"""Encodes the AArch64 instructions that trampolines are made of.

All instructions are 32 bits. Branch targets are addresses or label names,
resolved when `bytes()` is called. tests/test_aarch64_encoding.py checks each
encoding against Keystone.
"""

from __future__ import annotations

import struct

SP = XZR = 31
LR = 30
COND = {"eq": 0, "ne": 1, "hs": 2, "lo": 3, "mi": 4, "pl": 5, "vs": 6, "vc": 7,
        "hi": 8, "ls": 9, "ge": 10, "lt": 11, "gt": 12, "le": 13, "al": 14}


def _signed(value: int, bits: int, what: str) -> int:
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise OverflowError(f"{what} offset {value:#x} out of range")
    return value & ((1 << bits) - 1)


def b_imm(source: int, target: int, link: bool = False) -> int:
    delta = target - source
    return (0x94000000 if link else 0x14000000) | _signed(delta >> 2, 26, "branch")


def adrp_imm(rd: int, source: int, target: int) -> int:
    pages = (target >> 12) - (source >> 12)
    imm = _signed(pages, 21, "adrp")
    return 0x90000000 | (imm & 3) << 29 | (imm >> 2) << 5 | rd


class Writer:
    def __init__(self, address: int):
        self.address = address
        self.words = []
        self.labels = {}
        self._fixups = []  # (index, kind, target)

    @property
    def pc(self) -> int:
        return self.address + 4 * len(self.words)

    def label(self, name: str) -> None:
        self.labels[name] = self.pc

    def word(self, value: int) -> None:
        self.words.append(value & 0xFFFFFFFF)

    def raw(self, data: bytes) -> None:
        self.words.extend(struct.unpack(f"<{len(data) // 4}I", data))

    def _later(self, kind: str, target, base: int) -> None:
        self._fixups.append((len(self.words), kind, target))
        self.words.append(base)

    def _resolve(self, target) -> int:
        return self.labels[target] if isinstance(target, str) else target

    def bytes(self) -> bytes:
        for index, kind, target in self._fixups:
            source = self.address + 4 * index
            address = self._resolve(target)
            word = self.words[index]
            if kind == "b":
                word = b_imm(source, address, link=bool(word & 0x80000000))
            elif kind == "imm19":  # b.cond, cbz/cbnz, ldr literal
                word |= _signed((address - source) >> 2, 19, "branch") << 5
            elif kind == "imm14":  # tbz/tbnz
                word |= _signed((address - source) >> 2, 14, "test branch") << 5
            elif kind == "adrp":
                word = adrp_imm(word & 31, source, address)
            elif kind == "adr":
                imm = _signed(address - source, 21, "adr")
                word |= (imm & 3) << 29 | (imm >> 2) << 5
            self.words[index] = word
        return struct.pack(f"<{len(self.words)}I", *self.words)

    # -- branches ------------------------------------------------------------
    def b(self, target) -> None:
        self._later("b", target, 0x14000000)

    def bl(self, target) -> None:
        self._later("b", target, 0x94000000)

    def b_cond(self, cond: str, target) -> None:
        self._later("imm19", target, 0x54000000 | COND[cond])

    def cbz(self, rt: int, target, wide: bool = True) -> None:
        self._later("imm19", target, (0xB4000000 if wide else 0x34000000) | rt)

    def cbnz(self, rt: int, target, wide: bool = True) -> None:
        self._later("imm19", target, (0xB5000000 if wide else 0x35000000) | rt)

    def tbnz(self, rt: int, bit: int, target) -> None:
        """tbnz xt, #bit, target: a test that sets no flags"""
        self._later("imm14", target, 0x37000000 | (bit >> 5) << 31 | (bit & 31) << 19 | rt)

    def tbz(self, rt: int, bit: int, target) -> None:
        """tbz xt, #bit, target: a test that sets no flags"""
        self._later("imm14", target, 0x36000000 | (bit >> 5) << 31 | (bit & 31) << 19 | rt)

    def br(self, rn: int) -> None:
        self.word(0xD61F0000 | rn << 5)

    # -- addresses -----------------------------------------------------------
    def adrp(self, rd: int, target) -> None:
        self._later("adrp", target, rd)

    def adr(self, rd: int, target) -> None:
        self._later("adr", target, 0x10000000 | rd)

    def address_of(self, rd: int, target: int) -> None:
        """rd = target, from anywhere within 4 GiB: adrp + add."""
        self.adrp(rd, target)
        self.add_imm(rd, rd, target & 0xFFF)

    def ldr_literal(self, rt: int, target) -> None:
        self._later("imm19", target, 0x58000000 | rt)

    # -- arithmetic ----------------------------------------------------------
    def add_imm(self, rd: int, rn: int, imm: int) -> None:
        """rd = rn + imm, for imm < 2**24 (one or two instructions)."""
        if imm >> 24:
            raise OverflowError(f"immediate {imm:#x} too large")
        if imm >> 12 or not imm:
            self.word(0x91400000 | (imm >> 12) << 10 | rn << 5 | rd)
            rn = rd
        if imm & 0xFFF:
            self.word(0x91000000 | (imm & 0xFFF) << 10 | rn << 5 | rd)

    def sub_imm(self, rd: int, rn: int, imm: int) -> None:
        self.word(0xD1000000 | (imm & 0xFFF) << 10 | rn << 5 | rd)

    def mul(self, rd: int, rn: int, rm: int) -> None:
        self.word(0x9B007C00 | rm << 16 | rn << 5 | rd)

    def lsr(self, rd: int, rn: int, shift: int) -> None:
        self.word(0xD340FC00 | shift << 16 | rn << 5 | rd)

    def and_mask(self, rd: int, rn: int, mask: int) -> None:
        """rd = rn & mask, for a mask of contiguous ones."""
        shift = (mask & -mask).bit_length() - 1
        ones = bin(mask).count("1")
        assert mask == ((1 << ones) - 1) << shift
        self.word(0x92400000 | ((64 - shift) % 64) << 16 | (ones - 1) << 10 | rn << 5 | rd)

    def mov(self, rd: int, rm: int) -> None:
        self.word(0xAA0003E0 | rm << 16 | rd)

    def mov_imm(self, rd: int, value: int) -> None:
        """rd = value (< 2**32): movz, then movk for the upper half."""
        self.word(0xD2800000 | (value & 0xFFFF) << 5 | rd)
        if value >> 16:
            self.word(0xF2A00000 | (value >> 16 & 0xFFFF) << 5 | rd)

    def mrs_tpidr_el0(self, rt: int) -> None:
        self.word(0xD53BD040 | rt)

    # -- memory --------------------------------------------------------------
    def ldr(self, rt: int, rn: int, offset: int = 0) -> None:
        self.word(0xF9400000 | (offset // 8) << 10 | rn << 5 | rt)

    def ldr_w(self, rt: int, rn: int, offset: int = 0) -> None:
        """ldr wt, [xn, #offset]: 32 bits, zero-extended"""
        assert offset % 4 == 0
        self.word(0xB9400000 | (offset // 4) << 10 | rn << 5 | rt)

    def str_(self, rt: int, rn: int, offset: int = 0) -> None:
        self.word(0xF9000000 | (offset // 8) << 10 | rn << 5 | rt)

    def stp_pre(self, rt1: int, rt2: int, rn: int, offset: int) -> None:
        """stp rt1, rt2, [rn, #offset]!"""
        self.word(0xA9800000 | ((offset // 8) & 0x7F) << 15 | rt2 << 10 | rn << 5 | rt1)

    def stp(self, rt1: int, rt2: int, rn: int, offset: int) -> None:
        self.word(0xA9000000 | ((offset // 8) & 0x7F) << 15 | rt2 << 10 | rn << 5 | rt1)

    def ldp(self, rt1: int, rt2: int, rn: int, offset: int = 0) -> None:
        self.word(0xA9400000 | ((offset // 8) & 0x7F) << 15 | rt2 << 10 | rn << 5 | rt1)

    def ldp_post(self, rt1: int, rt2: int, rn: int, offset: int) -> None:
        """ldp rt1, rt2, [rn], #offset"""
        self.word(0xA8C00000 | ((offset // 8) & 0x7F) << 15 | rt2 << 10 | rn << 5 | rt1)

    def ldxr(self, rt: int, rn: int) -> None:
        self.word(0xC85F7C00 | rn << 5 | rt)

    def stxr(self, rs: int, rt: int, rn: int) -> None:
        """stxr ws, xt, [xn]"""
        self.word(0xC8007C00 | rs << 16 | rn << 5 | rt)

    def quad(self, value: int) -> None:
        self.words += [value & 0xFFFFFFFF, value >> 32]

    def add_reg(self, rd: int, rn: int, rm: int) -> None:
        self.word(0x8B000000 | rm << 16 | rn << 5 | rd)

    def sub_reg(self, rd: int, rn: int, rm: int) -> None:
        self.word(0xCB000000 | rm << 16 | rn << 5 | rd)
