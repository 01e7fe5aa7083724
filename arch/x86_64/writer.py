"""Encodes the handful of x86_64 instructions that trampolines are made of.

Methods are named by the instruction and take operands, as the arm64 writer's do:
registers (RAX ... R15, their 32-bit views EAX ... R15D, 8-bit AL ... R15B), memory
(`Mem`: base + index * scale + displacement, fs- or gs-relative; `Rip`: an address
or a label), immediates (a value, or a template's `Hole`). Only the instructions
trampolines need are here, no 16-bit operands; each form is encoded in full (REX,
ModRM, SIB, disp8 or disp32), and tests/test_x86_writer.py checks them against
Keystone over every register.

Every branch uses the 32-bit form so that sizes are known before targets are.
Labels are resolved when `bytes()` is called.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional, Union


class Reg:
    """A general register: its number (rax = 0 ... r15 = 15) and width in bits."""

    __slots__ = ("n", "bits", "name")

    def __init__(self, n: int, bits: int, name: str):
        self.n, self.bits, self.name = n, bits, name

    def __repr__(self) -> str:
        return self.name


_LOW = ("ax", "cx", "dx", "bx", "sp", "bp", "si", "di")
GPR64 = tuple(Reg(n, 64, f"r{_LOW[n]}" if n < 8 else f"r{n}") for n in range(16))
GPR32 = tuple(Reg(n, 32, f"e{_LOW[n]}" if n < 8 else f"r{n}d") for n in range(16))
GPR8 = tuple(Reg(n, 8, ("al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil")[n] if n < 8
                 else f"r{n}b") for n in range(16))
RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15 = GPR64
EAX, ECX, EDX, EBX, ESP, EBP, ESI, EDI, R8D, R9D, R10D, R11D, R12D, R13D, R14D, R15D = GPR32
AL, CL, DL, BL, SPL, BPL, SIL, DIL, R8B, R9B, R10B, R11B, R12B, R13B, R14B, R15B = GPR8

CC = {"o": 0, "no": 1, "b": 2, "ae": 3, "e": 4, "ne": 5, "be": 6, "a": 7,
      "s": 8, "ns": 9, "p": 10, "np": 11, "l": 12, "ge": 13, "le": 14, "g": 15}


def rel32(source_end: int, target: int) -> bytes:
    """A 32-bit displacement from the end of an instruction to `target`."""
    delta = target - source_end
    if not -(1 << 31) <= delta < (1 << 31):
        raise OverflowError(f"target {target:#x} is out of rel32 reach of {source_end:#x}")
    return struct.pack("<i", delta)


def jmp_rel32(source: int, target: int) -> bytes:
    return b"\xe9" + rel32(source + 5, target)


def jmp_rel8(source: int, target: int) -> bytes:
    delta = target - (source + 2)
    if not -128 <= delta < 128:
        raise OverflowError(f"target {target:#x} is out of rel8 reach of {source:#x}")
    return b"\xeb" + struct.pack("<b", delta)


class Hole:
    """An immediate or a displacement a template leaves open (see `Template`): the
    value at `slot` of what each use gives, times `scale`."""

    __slots__ = ("slot", "scale")

    def __init__(self, slot: int, scale: int = 1):
        self.slot, self.scale = slot, scale

    def __rmul__(self, factor: int) -> "Hole":
        return Hole(self.slot, self.scale * factor)


@dataclass(frozen=True)
class Mem:
    """[base + index * scale + disp] (no base: [index * scale + disp32], or [disp32]),
    fs- or gs-relative with `seg`. `bits` is the size
    read or written where no register operand gives it (64 then by default). The
    displacement takes one byte where it fits unless `disp32` asks for four (a Hole
    always takes four: a template's code has the same size for every value)."""

    base: Optional[Reg] = None
    index: Optional[Reg] = None
    scale: int = 1
    disp: Union[int, Hole] = 0
    bits: Optional[int] = None
    seg: Optional[str] = None
    disp32: bool = False


@dataclass(frozen=True)
class Rip:
    """[rip + disp32]: the memory at `target`, an address or a label name."""

    target: Union[int, str]
    bits: Optional[int] = None


_SEGMENTS = {None: b"", "fs": b"\x64", "gs": b"\x65"}
_SCALES = {1: 0, 2: 1, 4: 2, 8: 3}
# the ALU group's opcode extensions (the /digit of 80, 81, 83; 8 * it + 0..5 the others)
_ADD, _AND, _SUB, _CMP = 0, 4, 5, 7


@dataclass(frozen=True)
class Template:
    """Code written once and copied to each place it goes (`Writer.splice`): branches
    between its own labels are already resolved; what depends on where it lands,
    or on the values of its holes, is kept aside. Label names lose the prefix
    they were written with and take the one of each use."""

    code: bytes
    labels: tuple  # (name, offset)
    holes: tuple  # (offset, struct format, slot, scale)
    absolute: tuple  # (rel32 field, end of instruction, address): fixed targets
    outside: tuple  # (rel32 field, end of instruction, name): labels of the user


class Writer:
    """Appends instructions at a known address; targets are addresses or label names."""

    def __init__(self, address: int):
        self.address = address
        self.code = bytearray()
        self.labels = {}
        self._fixups = []  # (offset of rel32 field, end of instruction offset, target)
        self._holes = []  # (offset, struct format, Hole): only while writing a template

    @property
    def pc(self) -> int:
        return self.address + len(self.code)

    def label(self, name: str) -> None:
        self.labels[name] = self.pc

    def raw(self, data: bytes) -> None:
        self.code += data

    def _rel32_to(self, target, tail: bytes = b"") -> None:
        """A rel32 field whose displacement counts from after `tail` (an immediate)."""
        field = len(self.code)
        self.code += b"\0\0\0\0" + tail
        self._fixups.append((field, len(self.code), target))

    def move_to(self, address: int) -> None:
        """Places what was written at `address` instead (its labels move with it): for
        code whose only dependence on its address is in labels and branches, resolved
        by bytes()."""
        delta = address - self.address
        self.labels = {name: at + delta for name, at in self.labels.items()}
        self.address = address

    def bytes(self) -> bytes:
        for field, end, target in self._fixups:
            address = self.labels[target] if isinstance(target, str) else target
            self.code[field:field + 4] = rel32(self.address + end, address)
        return bytes(self.code)

    def _imm(self, fmt: str, value) -> None:
        """An immediate or a displacement: a value, or a Hole while writing a template."""
        if isinstance(value, Hole):
            self._holes.append((len(self.code), fmt, value))
            value = 0
        self.code += struct.pack(fmt, value)

    # -- templates -------------------------------------------------------------
    def template(self, prefix: str, start: int = 0) -> Template:
        """What this writer (at address 0) wrote from offset `start` on, as a Template;
        its labels are named `prefix` + name."""
        assert self.address == 0 and not any(field < start for field, _, _ in self._fixups)
        internal, absolute, outside = [], [], []
        for field, end, target in self._fixups:
            if not isinstance(target, str):
                absolute.append((field - start, end - start, target))
            elif target in self.labels:
                internal.append((field, end, self.labels[target]))
            else:
                assert target.startswith(prefix), target
                outside.append((field - start, end - start, target[len(prefix):]))
        for field, end, address in internal:
            self.code[field:field + 4] = rel32(end, address)
        labels = tuple((name[len(prefix):], at - start) for name, at in self.labels.items())
        holes = tuple((at - start, fmt, hole.slot, hole.scale) for at, fmt, hole in self._holes)
        return Template(bytes(self.code[start:]), labels, holes, tuple(absolute),
                        tuple(outside))

    def splice(self, template: Template, prefix: str, values: tuple,
               fixed: Optional[dict] = None) -> None:
        """Copy `template` here, its labels named `prefix` + name, its holes filled
        from `values`; a label outside it named in `fixed` (by its name in the
        template) is that address (which move_to leaves where it is)."""
        base = len(self.code)
        at = self.address + base
        code = self.code
        code += template.code
        for offset, fmt, slot, scale in template.holes:
            struct.pack_into(fmt, code, base + offset, values[slot] * scale)
        for field, end, address in template.absolute:  # (resolved by bytes(): see move_to)
            self._fixups.append((base + field, base + end, address))
        for field, end, name in template.outside:
            self._fixups.append((base + field, base + end,
                                 fixed[name] if fixed and name in fixed else prefix + name))
        for name, offset in template.labels:
            self.labels[prefix + name] = at + offset

    # -- encoding ----------------------------------------------------------------
    def _insn(self, opcode: bytes, reg, rm, *, wide: bool, prefix: bytes = b"",
              imm: tuple = None) -> None:
        """prefix, REX, opcode, then ModRM: its reg field `reg` (a Reg, or an opcode
        extension), its r/m `rm` (a Reg, Mem or Rip) with SIB and displacement; then
        the immediate `imm`, (struct format, value)."""
        regs = [r for r in (reg, rm) if isinstance(r, Reg)]
        reg = reg.n if isinstance(reg, Reg) else reg
        rex = 0x48 if wide else 0
        rex |= (reg >> 3) << 2  # REX.R
        seg = b""
        if isinstance(rm, Reg):
            rex |= rm.n >> 3  # REX.B
        elif isinstance(rm, Mem):
            seg = _SEGMENTS[rm.seg]
            rex |= (rm.index.n >> 3) << 1 if rm.index else 0  # REX.X
            rex |= rm.base.n >> 3 if rm.base else 0  # REX.B
        if any(r.bits == 8 and 4 <= r.n < 8 for r in regs):
            rex |= 0x40  # spl, bpl, sil, dil: without a REX these would be ah, ch, dh, bh
        self.code += prefix + seg + (bytes((rex | 0x40,)) if rex else b"") + opcode
        reg &= 7
        if isinstance(rm, Reg):
            self.code.append(0xC0 | reg << 3 | rm.n & 7)
        elif isinstance(rm, Rip):
            self.code.append(0x05 | reg << 3)
            assert imm is None or not isinstance(imm[1], Hole)
            self._rel32_to(rm.target, b"" if imm is None else struct.pack(*imm))
            return
        else:
            self._address(reg, rm)
        if imm is not None:
            self._imm(*imm)

    def _address(self, reg: int, m: Mem) -> None:
        """ModRM, SIB and displacement of a memory operand (not RIP-relative)."""
        base, index, disp = m.base, m.index, m.disp
        assert all(r is None or r.bits == 64 for r in (base, index))
        assert index is not RSP, "rsp cannot be an index"  # (100 there means none)
        long = m.disp32 or isinstance(disp, Hole)
        if base is None:
            mod = 0  # no base: a disp32 after the SIB (mod 00, r/m 101 alone is rip-relative)
        elif not long and disp == 0 and base.n & 7 != 5:
            mod = 0  # (rbp and r13 at mod 00 mean no base, or rip: they take a disp8 of 0)
        elif not long and -128 <= disp < 128:
            mod = 1
        else:
            mod = 2
        if index is None and base is not None and base.n & 7 != 4:
            self.code.append(mod << 6 | reg << 3 | base.n & 7)
        else:  # an index, no base, or rsp or r12 as base: their r/m 100 means a SIB follows
            self.code.append(mod << 6 | reg << 3 | 4)
            self.code.append(_SCALES[m.scale] << 6 | (index.n & 7 if index else 4) << 3
                             | (base.n & 7 if base else 5))
        if mod == 1:
            self.code += struct.pack("<b", disp)
        elif mod == 2 or base is None:
            self._imm("<i", disp)

    @staticmethod
    def _bits(*operands) -> int:
        """The operand size: of the register operands and the memory's, which agree
        (a memory operand without a size takes theirs, or 64)."""
        sizes = {op.bits for op in operands if isinstance(op, Reg)}
        sizes |= {op.bits for op in operands if isinstance(op, (Mem, Rip)) and op.bits}
        if not sizes:
            sizes = {64}
        assert len(sizes) == 1, f"operands of different sizes: {operands}"
        return sizes.pop()

    def _alu(self, ext: int, dst, src, imm32: bool = False, prefix: bytes = b"") -> None:
        """add, and, sub, cmp (`ext` their /digit): dst, src is r/m, reg or reg, r/m or
        r/m, imm. An immediate takes one byte where it fits unless `imm32` asks for four
        (a Hole always takes four); rax, eax and al have their own short forms."""
        bits = self._bits(dst, src)
        wide, byte = bits == 64, bits == 8
        if isinstance(src, Reg):
            self._insn(bytes((8 * ext + (not byte),)), src, dst, wide=wide, prefix=prefix)
        elif isinstance(src, (Mem, Rip)):
            assert isinstance(dst, Reg)
            self._insn(bytes((8 * ext + 2 + (not byte),)), dst, src, wide=wide, prefix=prefix)
        elif byte:
            fmt = "<b" if src < 0 else "<B"
            if dst is AL:
                self.code += prefix + bytes((8 * ext + 4,)) + struct.pack(fmt, src)
            else:
                self._insn(b"\x80", ext, dst, wide=False, prefix=prefix, imm=(fmt, src))
        elif isinstance(src, int) and not imm32 and -128 <= _signed32(bits, src) < 128:
            self._insn(b"\x83", ext, dst, wide=wide, prefix=prefix,
                       imm=("<b", _signed32(bits, src)))
        else:
            fmt = _imm32_format(bits, src)
            if isinstance(dst, Reg) and dst.n == 0:  # rax, eax
                self.code += prefix + (b"\x48" if wide else b"") + bytes((8 * ext + 5,))
                self._imm(fmt, src)
            else:
                self._insn(b"\x81", ext, dst, wide=wide, prefix=prefix, imm=(fmt, src))

    # -- data --------------------------------------------------------------------
    def mov(self, dst, src) -> None:
        """mov reg, r/m; mov r/m, reg; mov reg32, imm32 (zero-extended: movabs for a
        64-bit value)."""
        if isinstance(src, (int, Hole)):
            assert isinstance(dst, Reg) and dst.bits == 32, "mov r32, imm32 only"
            self.code += (b"\x41" if dst.n >= 8 else b"") + bytes((0xB8 + (dst.n & 7),))
            self._imm(_imm32_format(32, src), src)
            return
        bits = self._bits(dst, src)
        if isinstance(src, Reg):
            self._insn(b"\x88" if bits == 8 else b"\x89", src, dst, wide=bits == 64)
        else:
            self._insn(b"\x8a" if bits == 8 else b"\x8b", dst, src, wide=bits == 64)

    def movabs(self, dst: Reg, value: int) -> None:
        """mov reg64, imm64"""
        assert dst.bits == 64
        self.code += bytes((0x48 | dst.n >> 3, 0xB8 + (dst.n & 7)))
        self.code += struct.pack("<Q", value & (1 << 64) - 1)

    def lea(self, dst: Reg, src) -> None:
        """lea reg64, [memory]: arithmetic that leaves the flags alone."""
        assert dst.bits == 64 and isinstance(src, (Mem, Rip))
        self._insn(b"\x8d", dst, src, wide=True)

    def push(self, src, imm32: bool = False) -> None:
        """push reg64; push imm (sign-extended: one byte where it fits unless `imm32`)."""
        if isinstance(src, Reg):
            assert src.bits == 64
            self.code += (b"\x41" if src.n >= 8 else b"") + bytes((0x50 + (src.n & 7),))
        elif isinstance(src, int) and not imm32 and -128 <= src < 128:
            self.code += b"\x6a" + struct.pack("<b", src)
        else:
            self.code.append(0x68)
            self._imm("<i", src)

    def pop(self, dst: Reg) -> None:
        assert dst.bits == 64
        self.code += (b"\x41" if dst.n >= 8 else b"") + bytes((0x58 + (dst.n & 7),))

    def pushfq(self) -> None:
        self.code.append(0x9C)

    def popfq(self) -> None:
        self.code.append(0x9D)

    def lahf(self) -> None:
        self.code.append(0x9F)

    def sahf(self) -> None:
        self.code.append(0x9E)

    def rdfsbase(self, dst: Reg) -> None:
        """rdfsbase reg64: the fs base, without a system call (where the kernel allows it)"""
        assert dst.bits == 64
        self._insn(b"\x0f\xae", 0, dst, wide=True, prefix=b"\xf3")

    # -- arithmetic ----------------------------------------------------------------
    def add(self, dst, src, imm32: bool = False, lock: bool = False) -> None:
        """add; with `lock`, atomic (memory only)."""
        assert not lock or isinstance(dst, (Mem, Rip))
        self._alu(_ADD, dst, src, imm32, b"\xf0" if lock else b"")

    def sub(self, dst, src, imm32: bool = False) -> None:
        self._alu(_SUB, dst, src, imm32)

    def and_(self, dst, src, imm32: bool = False) -> None:
        self._alu(_AND, dst, src, imm32)

    def cmp(self, left, right, imm32: bool = False) -> None:
        self._alu(_CMP, left, right, imm32)

    def test_byte(self, dst, value: int) -> None:
        """test r/m8, imm8"""
        self._insn(b"\xf6", 0, dst, wide=False, imm=("<B", value))

    def test(self, left, right: Reg) -> None:
        """test r/m, reg"""
        bits = self._bits(left, right)
        self._insn(b"\x84" if bits == 8 else b"\x85", right, left, wide=bits == 64)

    def imul(self, dst: Reg, src) -> None:
        """imul reg, r/m"""
        bits = self._bits(dst, src)
        assert bits != 8
        self._insn(b"\x0f\xaf", dst, src, wide=bits == 64)

    def shr(self, dst, count: int) -> None:
        """shr r/m, imm8"""
        bits = self._bits(dst)
        if count == 1:
            self._insn(b"\xd0" if bits == 8 else b"\xd1", 5, dst, wide=bits == 64)
        else:
            self._insn(b"\xc0" if bits == 8 else b"\xc1", 5, dst, wide=bits == 64,
                       imm=("<B", count))

    def setcc(self, cc: str, dst) -> None:
        """set<cc> r/m8"""
        assert self._bits(dst) == 8
        self._insn(bytes((0x0F, 0x90 + CC[cc])), 0, dst, wide=False)

    # -- branches ------------------------------------------------------------------
    def jmp(self, target) -> None:
        self.code.append(0xE9)
        self._rel32_to(target)

    def jcc(self, cc: str, target) -> None:
        self.code += bytes((0x0F, 0x80 + CC[cc]))
        self._rel32_to(target)

    def call(self, target) -> None:
        self.code.append(0xE8)
        self._rel32_to(target)

    def jrcxz(self, skip: int) -> None:
        """jrcxz over the next `skip` bytes: a branch that reads no flags"""
        self.code += b"\xe3" + struct.pack("<b", skip)

    def ret(self) -> None:
        self.code.append(0xC3)

    def align(self, to: int) -> None:
        self.code += bytes(-len(self.code) % to)


def _imm32_format(bits: int, value) -> str:
    """The struct format of a 4-byte immediate: sign-extended to a 64-bit operand;
    either way for a 32-bit one."""
    return "<I" if bits == 32 and (isinstance(value, Hole) or value >= 0) else "<i"


def _signed32(bits: int, value: int) -> int:
    """An immediate as the processor sign-extends it: 0xfffffff0 is -16 to a 32-bit
    operand (not to a 64-bit one, where it takes no 4-byte immediate)."""
    return value - (1 << 32) if bits == 32 and value >= 1 << 31 else value
