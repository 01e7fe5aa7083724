"""Encodes the handful of x86_64 instructions that trampolines are made of.

Every branch uses the 32-bit form so that sizes are known before targets are.
Labels are resolved when `bytes()` is called. tests/test_x86_writer.py checks
each encoding against Keystone.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

REG = {"rax": 0, "rcx": 1, "rdx": 2, "rbx": 3, "rsp": 4, "rbp": 5, "rsi": 6, "rdi": 7}
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
    """An immediate a template leaves open (see `Template`): the value at `slot` of
    what each use gives, times `scale`."""

    __slots__ = ("slot", "scale")

    def __init__(self, slot: int, scale: int = 1):
        self.slot, self.scale = slot, scale

    def __rmul__(self, factor: int) -> "Hole":
        return Hole(self.slot, self.scale * factor)


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

    def bytes(self) -> bytes:
        for field, end, target in self._fixups:
            address = self.labels[target] if isinstance(target, str) else target
            self.code[field:field + 4] = rel32(self.address + end, address)
        return bytes(self.code)

    def _imm(self, fmt: str, value) -> None:
        """An immediate: a value, or a Hole while writing a template."""
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

    def splice(self, template: Template, prefix: str, values: tuple) -> None:
        """Copy `template` here, its labels named `prefix` + name, its holes filled
        from `values`."""
        base = len(self.code)
        at = self.address + base
        code = self.code
        code += template.code
        for offset, fmt, slot, scale in template.holes:
            struct.pack_into(fmt, code, base + offset, values[slot] * scale)
        for field, end, address in template.absolute:
            code[base + field:base + field + 4] = rel32(at + end, address)
        for field, end, name in template.outside:
            self._fixups.append((base + field, base + end, prefix + name))
        for name, offset in template.labels:
            self.labels[prefix + name] = at + offset

    # -- stack and flags -----------------------------------------------------
    def lea_rsp(self, delta: int) -> None:
        """lea rsp, [rsp + delta]: moves the stack pointer without touching flags."""
        if -128 <= delta <= 127:
            self.code += b"\x48\x8d\x64\x24" + struct.pack("<b", delta)
        else:
            self.code += b"\x48\x8d\xa4\x24" + struct.pack("<i", delta)

    def push(self, reg: str) -> None:
        self.code.append(0x50 + REG[reg])

    def push_imm32(self, value: int) -> None:
        """push imm32 (sign-extended to 64 bits)"""
        self.code.append(0x68)
        self._imm("<I", value)

    def pop(self, reg: str) -> None:
        self.code.append(0x58 + REG[reg])

    def pushfq(self) -> None:
        self.code.append(0x9C)

    def popfq(self) -> None:
        self.code.append(0x9D)

    # -- branches ------------------------------------------------------------
    def jmp(self, target) -> None:
        self.code.append(0xE9)
        self._rel32_to(target)

    def jcc(self, cc: str, target) -> None:
        self.code += bytes((0x0F, 0x80 + CC[cc]))
        self._rel32_to(target)

    def call(self, target) -> None:
        self.code.append(0xE8)
        self._rel32_to(target)

    # -- the hit path --------------------------------------------------------
    def cmp_rip_qword_imm8(self, target, imm: int) -> None:
        """cmp qword ptr [rip + target], imm8"""
        self.code += b"\x48\x83\x3d"
        self._rel32_to(target, struct.pack("<b", imm))

    def mov_reg_rip(self, reg: str, target) -> None:
        """mov reg, qword ptr [rip + target]"""
        self.code += bytes((0x48, 0x8B, 0x05 | REG[reg] << 3))
        self._rel32_to(target)

    def lea_reg_rip(self, reg: str, target) -> None:
        """lea reg, [rip + target]"""
        self.code += bytes((0x48, 0x8D, 0x05 | REG[reg] << 3))
        self._rel32_to(target)

    def mov_rcx_fs0(self) -> None:
        """mov rcx, qword ptr fs:[0]: the thread pointer (x86_64 TLS ABI)."""
        self.code += b"\x64\x48\x8b\x0c\x25\x00\x00\x00\x00"

    def test_rcx_rcx(self) -> None:
        self.code += b"\x48\x85\xc9"

    def rdfsbase_rcx(self) -> None:
        """rdfsbase rcx: the fs base, without a system call (where the kernel allows it)"""
        self.code += b"\xf3\x48\x0f\xae\xc1"

    def movabs_rdx(self, value: int) -> None:
        self.code += b"\x48\xba" + struct.pack("<Q", value)

    def imul_rdx_rcx(self) -> None:
        self.code += b"\x48\x0f\xaf\xd1"

    def shr_rdx(self, count: int) -> None:
        self.code += b"\x48\xc1\xea" + bytes((count,))

    def and_edx(self, mask: int) -> None:
        self.code += b"\x81\xe2" + struct.pack("<I", mask)

    def cmp_rax_rdx_disp_rcx(self, disp: int) -> None:
        """cmp qword ptr [rax + rdx + disp32], rcx"""
        self.code += b"\x48\x39\x8c\x10" + struct.pack("<i", disp)

    def mov_rdx_rax_rdx_disp(self, disp: int) -> None:
        """mov rdx, qword ptr [rax + rdx + disp32]"""
        self.code += b"\x48\x8b\x94\x10" + struct.pack("<i", disp)

    def inc_rdx_disp(self, disp: int) -> None:
        """add qword ptr [rdx + disp32], 1: a plain add, safe on a thread-owned slot."""
        self.code += b"\x48\x83\x82" + struct.pack("<i", disp) + b"\x01"

    def mov_esi_imm(self, value: int) -> None:
        self.code.append(0xBE)
        self._imm("<I", value)

    def mov_rsp_disp_rax(self, disp: int) -> None:
        """mov qword ptr [rsp + disp8], rax"""
        self.code += b"\x48\x89\x44\x24" + struct.pack("<b", disp)

    # -- the trace path --------------------------------------------------------
    def push_r(self, n: int) -> None:
        """push r<n>, for any of the 16 registers (rax = 0 ... r15 = 15)."""
        self.code += (b"\x41" if n >= 8 else b"") + bytes((0x50 + (n & 7),))

    def pop_r(self, n: int) -> None:
        self.code += (b"\x41" if n >= 8 else b"") + bytes((0x58 + (n & 7),))

    def mov_rdi_rsp(self) -> None:
        self.code += b"\x48\x89\xe7"

    def lea_rcx_rsp(self, disp: int) -> None:
        """lea rcx, [rsp + disp32]"""
        self.code += b"\x48\x8d\x8c\x24" + struct.pack("<i", disp)

    def cmp_rip_byte_imm8(self, target, imm: int) -> None:
        """cmp byte ptr [rip + target], imm8"""
        self.code += b"\x80\x3d"
        self._rel32_to(target, struct.pack("<B", imm))

    def align(self, to: int) -> None:
        self.code += bytes(-len(self.code) % to)

    # -- the flags-preserving hit path -------------------------------------------
    def lea_rcx_rcx(self, disp: int) -> None:
        """lea rcx, [rcx + disp8]: arithmetic that leaves the flags alone"""
        self.code += b"\x48\x8d\x49" + struct.pack("<b", disp)

    def lea_rdx_rcx(self, disp: int) -> None:
        """lea rdx, [rcx + disp8]"""
        self.code += b"\x48\x8d\x51" + struct.pack("<b", disp)

    def jrcxz_short(self, disp: int) -> None:
        """jrcxz .+2+disp: a branch that reads no flags"""
        self.code += b"\xe3" + struct.pack("<b", disp)

    def seto_al(self) -> None:
        self.code += b"\x0f\x90\xc0"

    def lahf(self) -> None:
        self.code.append(0x9F)

    def sahf(self) -> None:
        self.code.append(0x9E)

    def add_al_7f(self) -> None:
        """add al, 0x7f: sets OF exactly when al (saved by seto) is 1"""
        self.code += b"\x04\x7f"

    def test_rdx_rdx(self) -> None:
        self.code += b"\x48\x85\xd2"

    def cmp_rdx_imm8(self, imm: int) -> None:
        self.code += b"\x48\x83\xfa" + struct.pack("<b", imm)

    def movabs_rsi(self, value: int) -> None:
        self.code += b"\x48\xbe" + struct.pack("<Q", value)

    def imul_rsi_rcx(self) -> None:
        self.code += b"\x48\x0f\xaf\xf1"

    def shr_rsi(self, count: int) -> None:
        self.code += b"\x48\xc1\xee" + bytes((count,))

    def and_esi(self, mask: int) -> None:
        self.code += b"\x81\xe6" + struct.pack("<I", mask)

    def cmp_rdx_rsi_disp_rcx(self, disp: int) -> None:
        """cmp qword ptr [rdx + rsi + disp32], rcx"""
        self.code += b"\x48\x39\x8c\x32" + struct.pack("<i", disp)

    def mov_rsi_rdx_rsi_disp(self, disp: int) -> None:
        """mov rsi, qword ptr [rdx + rsi + disp32]"""
        self.code += b"\x48\x8b\xb4\x32" + struct.pack("<i", disp)

    def inc_rsi_disp(self, disp: int) -> None:
        """add qword ptr [rsi + disp32], 1"""
        self.code += b"\x48\x83\x86"
        self._imm("<i", disp)
        self.code.append(0x01)

    def lock_inc_rsi_disp(self, disp: int) -> None:
        """lock add qword ptr [rsi + disp32], 1"""
        self.code += b"\xf0\x48\x83\x86"
        self._imm("<i", disp)
        self.code.append(0x01)

    def lock_inc_rdx_disp(self, disp: int) -> None:
        """lock add qword ptr [rdx + disp32], 1"""
        self.code += b"\xf0\x48\x83\x82" + struct.pack("<i", disp) + b"\x01"

    def mov_rax_rdx(self) -> None:
        self.code += b"\x48\x89\xd0"

    def mov_rdx_rsi(self) -> None:
        self.code += b"\x48\x89\xf2"

    def mov_ecx_imm(self, value: int) -> None:
        self.code.append(0xB9)
        self._imm("<I", value)

    # -- the exit check of an indirect jump ----------------------------------------
    def mov_rcx_rsp_disp(self, disp: int) -> None:
        """mov rcx, qword ptr [rsp + disp8]"""
        self.code += b"\x48\x8b\x4c\x24" + struct.pack("<b", disp)

    def sub_rdx_rcx(self) -> None:
        self.code += b"\x48\x29\xca"

    def add_rdx_rcx(self) -> None:
        self.code += b"\x48\x01\xca"

    def cmp_rdx_imm32(self, imm: int) -> None:
        self.code += b"\x48\x81\xfa" + struct.pack("<i", imm)
