"""The x86_64 backend: answers for arch/base.py's Backend."""

from __future__ import annotations

import re
from sys import intern
from typing import Optional

import capstone
import iced_x86
import numpy as np
from capstone import x86

from urewrite.arch.base import (BRANCH, CALL, JUMP, OTHER, PLAIN, RETURN, Backend, Insn, Runtime,
                                RuntimeRefs, RuntimeSpec, Sweep, SweepBatch, Window)
from urewrite.arch.x86_64 import (arguments, callback, fault_hook, faults, flags, jump_tables,
                                  relocator, return_address, runtime, linear_sweep, trampoline)
from urewrite.arch.x86_64.writer import jmp_rel8, jmp_rel32
from urewrite.trampolines.arguments import C_CONVENTION

INT3 = 0xCC
_BRANCH_MNEMONICS = frozenset(
    "jmp call jo jno jb jae je jne jbe ja js jns jp jnp jl jge jle jg jrcxz jecxz loop loope loopne"
    .split())
# Opcodes whose rel32 field names a code address: call/jmp rel32, jcc rel32 (0f 80..8f),
# and lea reg64, [rip + disp32] (a function pointer being taken, e.g. sa_restorer).
_REL32_ADDRESS = re.compile(rb"[\xe8\xe9]|\x0f[\x80-\x8f]|[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]",
                            re.DOTALL)


# (a file has millions of instructions and few distinct mnemonics: both are cached)
_BARE: dict = {}  # full mnemonic -> without prefixes
_EXIT_MNEMONICS: dict = {}  # full mnemonic -> the one that matters for exits, or None


_VERBATIM: dict = {}  # mnemonic -> whether it is never a branch (moves_verbatim)


def _bare_mnemonic(full: str) -> str:
    """The mnemonic without prefixes such as "bnd", "notrack", "rep"."""
    bare = _BARE.get(full)
    if bare is None:
        bare = _BARE[full] = full.split()[-1] if full else ""
    return bare


def _exit_mnemonic(full: str) -> Optional[str]:
    """The bare mnemonic when it is a return or a branch other than a call, else None."""
    if full not in _EXIT_MNEMONICS:
        mnemonic = _bare_mnemonic(full)
        _EXIT_MNEMONICS[full] = mnemonic if mnemonic in ("ret", "retq", "ljmp") or (
            mnemonic in _BRANCH_MNEMONICS and mnemonic != "call") else None
    return _EXIT_MNEMONICS[full]


# prefixes a `jmp rel32` ignores, for 0, 1 or 2 bytes before it: REX.W (the operand is
# 64-bit anyway), then an ES override (no memory operand); never 0x66, which would
# truncate the target
_PUN_PREFIXES = (b"", b"\x48", b"\x26\x48")
# pun_over_successor()'s candidates (made once): the low 3 bytes of the successor's
# displacement (the site's displacement is e9 and these: > 0), and its top byte
_SUCCESSOR_LOWS = np.arange(0, 0x800000, 0x100, dtype=np.int64)
_SITE_DISPLACEMENTS = _SUCCESSOR_LOWS << 8 | 0xE9
_SUCCESSOR_TOPS = np.arange(0x80, dtype=np.int64) << 24


# computed_addresses(): lea from rip, mov of an immediate to a register (of its size)
_LEA, _MOV, _NO_MNEMONIC = iced_x86.Mnemonic.LEA, iced_x86.Mnemonic.MOV, iced_x86.Mnemonic.INVALID
_RIP, _REGISTER = iced_x86.Register.RIP, iced_x86.OpKind.REGISTER
_IMMEDIATE_BITS = {iced_x86.OpKind.IMMEDIATE8: 8, iced_x86.OpKind.IMMEDIATE16: 16,
                   iced_x86.OpKind.IMMEDIATE32: 32, iced_x86.OpKind.IMMEDIATE64: 64,
                   iced_x86.OpKind.IMMEDIATE8TO16: 16, iced_x86.OpKind.IMMEDIATE8TO32: 32,
                   iced_x86.OpKind.IMMEDIATE8TO64: 64, iced_x86.OpKind.IMMEDIATE32TO64: 64}

_REG16 = frozenset("ax cx dx bx sp bp si di".split() + [f"r{n}w" for n in range(8, 16)])


def _branch_opcode(code: bytes) -> Optional[bytes]:
    """The prefix and opcode of a direct branch in a plain form, which alone decide its
    mnemonic: call or jmp rel32, jmp or jcc rel8, jcc rel32, maybe after a `bnd`
    prefix (f2); else None."""
    at = 1 if code[:1] == b"\xf2" else 0
    size = len(code) - at
    first = code[at] if size > 0 else -1
    if (first in (0xE8, 0xE9) and size == 5) or \
            ((first == 0xEB or 0x70 <= first <= 0x7F) and size == 2):
        return code[:at + 1]
    if first == 0x0F and size == 6 and 0x80 <= code[at + 1] <= 0x8F:
        return code[:at + 2]
    return None


def _target_readable(op_str: str) -> bool:
    """Whether an indirect jmp's target can be loaded into a register by a trampoline
    (relocator.load_jump_target): a 64-bit operand, other than rsp itself."""
    return not (op_str == "rsp" or op_str in _REG16 or op_str.startswith("word ptr"))


class X86_64Backend(Backend):
    name = "x86_64"
    elf_machine = 62
    patch_size = 5  # jmp rel32
    insn_alignment = 1
    branch_reach = (1 << 31) - 1
    state_size = runtime.STATE_SIZE
    live_state = runtime.LIVE_STATE
    redirects_returns = True
    callback_flags = callback.FLAGS
    gnu_triplet = "x86_64-linux-gnu"
    shadow_stack_name = "the CET shadow stack"

    def __init__(self):
        self.lite = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self._full = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self._full.detail = True
        self.branch_mnemonics: dict = {}  # _branch_opcode() -> mnemonic (direct_branch)
        self.jump_table_facts: dict = {}  # instruction bytes -> jump_tables.WriterFacts

    # -- reading -----------------------------------------------------------
    def decode(self, code: bytes, address: int, detail: bool = False) -> list:
        if detail:
            return [Insn(i.address, i.size, i.mnemonic, i.op_str, bytes(i.bytes), i)
                    for i in self._full.disasm(code, address)]
        # (mnemonics interned: a big file has millions of instructions and few mnemonics)
        return [Insn(at, size, intern(mnemonic), op_str, b"")
                for at, size, mnemonic, op_str in self.lite.disasm_lite(code, address)]

    def boundaries(self, code: bytes, address: int) -> list:
        rows = list(self.lite.disasm_lite(code, address))
        return [at for at, _, _, _ in rows] + [rows[-1][0] + rows[-1][1] if rows else address]

    def sweep(self, code: bytes, address: int) -> Sweep:
        # iced-x86 (docs/design.md, "Big files"): several times faster than Capstone.
        # Where it meets an instruction it cannot decode, Capstone's own sweep decides
        # where that ends.
        return linear_sweep.sweep(code, address, super().sweep)

    def sweep_all(self, data: bytes, spans) -> Optional[SweepBatch]:
        return linear_sweep.sweep_all(data, spans, super().sweep)

    sweep_search_engine = linear_sweep.sweep_search_engine
    stub_places_engine = getattr(linear_sweep.native_sweep, "StubPlaces", None)

    def flow_kind(self, insn: Insn) -> tuple:
        mnemonic = _bare_mnemonic(insn.mnemonic)
        if mnemonic in ("ret", "retq"):
            return RETURN, None
        if mnemonic == "xbegin":
            return CALL, int(insn.op_str, 16)
        if mnemonic not in _BRANCH_MNEMONICS:
            return (OTHER if mnemonic == "ljmp" else PLAIN), None
        target = self.direct_branch_target(insn)
        if target is None:  # an indirect jump, or call
            return (PLAIN if mnemonic == "call" else OTHER), None
        if mnemonic in ("call", "jmp"):
            return (CALL if mnemonic == "call" else JUMP), target
        return (OTHER if mnemonic in ("jrcxz", "jecxz") or mnemonic.startswith("loop")
                else BRANCH), target

    def landing_pad_size(self, first: Insn) -> int:
        return 4 if first.mnemonic == "endbr64" else 0

    def direct_branch_target(self, insn: Insn) -> Optional[int]:
        if _bare_mnemonic(insn.mnemonic) in _BRANCH_MNEMONICS:
            if insn.op_str.startswith("0x"):
                return int(insn.op_str, 16)
            if insn.op_str.isdigit():  # (Capstone writes targets below 10 in decimal)
                return int(insn.op_str)
        return None

    def code_reference_table(self, code: bytes, base: int) -> tuple:
        # call/jmp rel32 (e8, e9), jcc rel32 (0f 80..8f), lea r64, [rip + disp32]
        # (48/4c 8d, ModRM mod 00 r/m 101): the 4-byte field follows the opcode bytes
        n = len(code)
        b = np.frombuffer(code + bytes(8), dtype=np.uint8)  # padded: every b[i + k] exists
        # (one pass over the bytes for each pattern's rarest byte, the rest checked
        # at its few matches: fewer passes and temporaries than whole-file masks)
        near = np.flatnonzero((b[:n] & 0xFE) == 0xE8)
        jcc = np.flatnonzero(b[:n] == 0x0F)
        jcc = jcc[(b[jcc + 1] & 0xF0) == 0x80]
        lea = np.flatnonzero(b[1:n + 1] == 0x8D)
        lea = lea[((b[lea] | 4) == 0x4C) & ((b[lea + 2] & 0xC7) == 0x05)]
        start = np.concatenate([near, jcc, lea])
        field = np.concatenate([near + 1, jcc + 2, lea + 3])
        whole = field + 4 <= n
        start, field = start[whole], field[whole]
        displacement = (b[field].astype(np.uint32) | b[field + 1].astype(np.uint32) << 8
                        | b[field + 2].astype(np.uint32) << 16
                        | b[field + 3].astype(np.uint32) << 24).view(np.int32)
        return base + start, base + field + 4 + displacement.astype(np.int64)

    def names_address(self, insn: Insn, target: int) -> bool:
        if self.direct_branch_target(insn) == target:
            return True
        # lea reg, [rip + disp32]: the displacement is its last field
        return insn.mnemonic == "lea" and "rip" in insn.op_str and \
            insn.end + int.from_bytes(insn.raw[-4:], "little", signed=True) == target

    def holds_constant(self, insn: Insn, offset: int, value: int) -> bool:
        d = insn.detail
        if d is None:
            return True  # decoded without detail: cannot tell
        fields = []
        if d.imm_size and self.direct_branch_target(insn) is None:  # a branch's is relative
            fields.append((d.imm_offset, d.imm_size))
        if d.disp_size and not _ip_relative(d):  # [rip + disp] names another address
            fields.append((d.disp_offset, d.disp_size))
        return any(at == offset and size >= 4 and
                   int.from_bytes(insn.raw[at:at + size], "little") == value
                   for at, size in fields)

    def exit_kind(self, insn: Insn, inside) -> tuple:
        mnemonic = _exit_mnemonic(insn.mnemonic)
        if mnemonic is None:
            return False, None  # most instructions: no branch at all
        if mnemonic in ("ret", "retq"):
            return True, None
        if mnemonic == "ljmp":
            return False, f"the far jump at {insn.address:#x} may leave it"
        if mnemonic in _BRANCH_MNEMONICS and mnemonic != "call":
            target = self.direct_branch_target(insn)
            if target is None:
                # an exit when it goes outside (checked in the trampoline), if its target
                # can be read as it reads it: a 64-bit register or memory operand
                if mnemonic == "jmp" and _target_readable(insn.op_str):
                    return "outside", None
                return False, f"the indirect jump at {insn.address:#x} may leave it"
            if inside(target):
                return False, None
            if mnemonic == "jmp":
                return True, None  # a tail call
            if mnemonic.startswith("j") and mnemonic != "jrcxz" and mnemonic != "jecxz":
                return "taken", None  # a conditional tail call
            return False, f"the conditional jump at {insn.address:#x} leaves it"
        return False, None

    def direct_branch(self, code: bytes, address: int, target: int) -> Optional[Insn]:
        # (a plain form's mnemonic depends on its opcode alone, and Capstone writes its
        # target in hex: learnt from the first of each opcode, then made without a
        # decode; most instructions a window reads are calls)
        opcode = _branch_opcode(code)
        mnemonic = self.branch_mnemonics.get(opcode) if opcode else None
        if mnemonic is not None:
            return Insn(address, len(code), mnemonic, f"{target:#x}", b"")
        decoded = self.decode(code, address)
        if len(decoded) != 1 or decoded[0].size != len(code):
            return None
        if opcode and decoded[0].op_str == f"{target:#x}":
            self.branch_mnemonics[opcode] = decoded[0].mnemonic
        return decoded[0]

    def computed_addresses(self, code: bytes, address: int) -> list:
        # (iced-x86 in the native module, as the sweep, where it was built: a big
        # file's functions with an indirect jump that is no table hold 100,000s of
        # instructions, slow to decode with Capstone)
        if linear_sweep.native_sweep is not None:
            return linear_sweep.native_sweep.computed_addresses(code, address)
        return self.python_computed_addresses(code, address)

    @staticmethod
    def python_computed_addresses(code: bytes, address: int) -> list:
        found = []
        for insn in iced_x86.Decoder(64, code, ip=address):
            mnemonic = insn.mnemonic
            if mnemonic == _LEA:
                if insn.memory_base == _RIP:
                    found.append(insn.ip_rel_memory_address)
            elif mnemonic == _MOV:
                bits = _IMMEDIATE_BITS.get(insn.op1_kind)
                if bits and insn.op0_kind == _REGISTER:
                    value = insn.immediate(1) & ((1 << bits) - 1)  # (as its register holds it)
                    if value >= 0x1000:  # (smaller ones: counts, flags, characters)
                        found.append(value)
            elif mnemonic == _NO_MNEMONIC:  # (an invalid instruction: the code ends here)
                break
        return found

    def is_indirect_jump(self, insn: Insn) -> bool:
        return _bare_mnemonic(insn.mnemonic) == "jmp" and self.direct_branch_target(insn) is None

    def jump_tables(self, insns: list, indexes: list, read) -> list:
        return jump_tables.jump_tables(self, insns, indexes, read)

    def is_call_frame(self, frame) -> bool:
        # CFA = rsp + 8, the return address at CFA - 8: what `call` leaves (DWARF rsp = 7)
        return (frame.cfa_register, frame.cfa_offset, frame.return_address) == \
            (7, 8, ("offset", -8))

    def return_redirect_problem(self, code: bytes, address: int) -> Optional[str]:
        return return_address.problem(code, address)

    def return_value(self, convention=C_CONVENTION, returned: bool = False) -> list:
        return arguments.abi_return(convention, returned)

    def is_padding(self, insn: Insn) -> bool:
        return insn.mnemonic in ("nop", "int3") or insn.mnemonic.endswith(" nop")

    def ends_flow(self, insn: Insn) -> bool:
        return _bare_mnemonic(insn.mnemonic) in ("ret", "retq", "jmp", "ud2", "hlt", "int3")

    hop_size = 2  # jmp rel8

    def hop_reach(self, address: int) -> tuple:
        return address + 2 - 128, address + 2 + 127

    def is_call(self, insn: Insn) -> bool:
        return _bare_mnemonic(insn.mnemonic) == "call"

    def hop_patch(self, window: Window, landing: int) -> bytes:
        return jmp_rel8(window.address, landing) + bytes([INT3]) * (window.size - 2)

    puns = True

    def pun(self, window: Window, following: bytes, stubs) -> Optional[tuple]:
        # `jmp rel32` at window + j, after j prefixes it ignores; of its displacement
        # the low `free` bytes are still in the window (ours to choose), the rest are
        # the kept bytes that follow it
        for j in range(min(window.size, len(_PUN_PREFIXES))):
            free = window.size - 1 - j
            if free > 2:
                continue  # (a 4-byte window: its 2 free bytes are plenty at j = 1)
            high = int.from_bytes(following[:4 - free], "little") << (8 * free)
            displacement = high - (1 << 32) if high >> 31 else high
            end = window.address + j + 5
            lows = np.arange(0, 1 << (8 * free), 8, dtype=np.int64)  # (8 apart: fewer tries)
            found = stubs.first(end + displacement + lows, window.address)
            if len(found):
                low = int(lows[found[0]])
                return (_PUN_PREFIXES[j] + b"\xe9" + low.to_bytes(free, "little"),
                        end + displacement + low, j + 5)
        return None

    def pun_over_successor(self, window: Window, stubs) -> Optional[tuple]:
        # the site's `jmp rel32` ends 4 bytes into the successor, after window.size - 1
        # prefixes: its displacement is the successor's jump's e9 and the low 3 bytes of
        # that one's displacement, whose top byte is free
        j = window.size - 1
        if j >= len(_PUN_PREFIXES):
            return None
        site_end, successor_end = window.end + 4, window.end + 5
        lows, tops = _SUCCESSOR_LOWS, _SUCCESSOR_TOPS
        site_stubs = site_end + _SITE_DISPLACEMENTS
        # site stubs to try a successor's stub with (each: 128 of those), all at once:
        # a row of successor stubs per site stub, the first row with one that fits wins
        tried = stubs.first(site_stubs, window.address, limit=64)
        if not len(tried):
            return None
        found = stubs.first_in_rows(successor_end + (tops[None, :] | lows[tried][:, None]),
                                    window.end, site_stubs[tried])
        if found is None:
            return None
        row, column = found
        k = tried[row]
        site_stub, low = int(site_stubs[k]), int(lows[k])
        displacement = int(tops[column]) | low
        return (_PUN_PREFIXES[j] + b"\xe9", site_stub,
                b"\xe9" + displacement.to_bytes(4, "little"), successor_end + displacement)

    # -- can I? ------------------------------------------------------------
    def relocation_problem(self, insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
        return relocator.relocation_problem(insn, is_last, shadow_stack)

    def needs_detail(self, insn: Insn) -> bool:
        # only calls, indirect branches and xbegin can be refused
        # (relocator.relocation_problem): a direct jump or branch is re-encoded to
        # reach its target from anywhere (most windows asked)
        mnemonic = _bare_mnemonic(insn.mnemonic)
        if mnemonic == "call" or mnemonic == "xbegin":
            return True
        return mnemonic in _BRANCH_MNEMONICS and self.direct_branch_target(insn) is None

    def quick_relocation_problem(self, insn: Insn, is_last: bool,
                                 shadow_stack: bool) -> Optional[tuple]:
        # a plain `call rel32` as the quick decoder (or direct_branch()) names it: no
        # prefix, its target in hex (Capstone writes those below 10 in decimal)
        if insn.op_str[:1].isdigit():
            target = self.direct_branch_target(insn) if insn.mnemonic == "call" else None
            if target is None or target < 10:
                return None
            return (relocator.call_problem(insn, is_last, shadow_stack),)
        # an indirect jump or call (its operand a register or memory, named by a letter):
        # a jump moves (relocation_problem: Capstone's X86_INS_JMP, prefixes or not); a
        # call as a direct one, unless its target is relative to the stack pointer
        # (whose operand names it: asked in detail)
        bare = _bare_mnemonic(insn.mnemonic)
        if not insn.op_str[:1].isalpha() or bare not in ("jmp", "call"):
            return None
        if bare == "jmp":
            return (None,)
        return None if "sp" in insn.op_str else \
            (relocator.call_problem(insn, is_last, shadow_stack),)

    def moves_verbatim(self, insn: Insn) -> bool:
        if "rip" in insn.op_str:  # a RIP-relative operand
            return False
        verdict = _VERBATIM.get(insn.mnemonic)
        if verdict is None:
            # a near return (relocator.verbatim_returns), or no jump, call, loop, return
            # or xbegin in any form (far, with prefixes): a mnemonic that could be one
            # of these is not taken as verbatim
            bare = _bare_mnemonic(insn.mnemonic)
            verdict = _VERBATIM[insn.mnemonic] = relocator.verbatim_returns(insn) or bool(
                bare) and not any(part in bare for part in ("j", "call", "ret", "loop", "xbegin"))
        return verdict

    translates_faults = True

    def moved_instructions(self, address: int, window: Window, points,
                           refs: RuntimeRefs) -> list:
        return trampoline.moved_instructions(address, window, points)

    def fault_hook(self, address: int, window: Window, moved) -> bytes:
        return fault_hook.build(address, window, moved)

    def may_fault(self, insn: Insn, g_in_register: bool) -> bool:
        return faults.may_fault(insn, g_in_register)

    def flags_live_at_entry(self) -> bool:
        # SysV x86_64 ABI: status flags are not preserved across calls, so no
        # function may read them before setting them. DF is clear and we never set it.
        return False

    def flags_live_inside(self, read, point: int) -> bool:
        return flags.live_at(read, point)

    # -- writing -----------------------------------------------------------
    def site_patch(self, window: Window, trampoline_address: int) -> bytes:
        jump = jmp_rel32(window.address, trampoline_address)
        return jump + bytes([INT3]) * (window.size - len(jump))

    def trampoline(self, address: int, window: Window, points, refs: RuntimeRefs) -> bytes:
        return trampoline.build(address, window, points, refs)

    def trampoline_apart(self, address: int, window: Window, points,
                         refs: RuntimeRefs) -> Optional[tuple]:
        return trampoline.build_apart(address, window, points, refs) if points else None

    def sdt_arguments(self, text: str, symbol) -> list:
        return arguments.sdt_arguments(text, symbol)

    def abi_arguments(self, count: int, convention=C_CONVENTION) -> list:
        return arguments.abi_arguments(count, convention)

    def runtime(self, spec: RuntimeSpec) -> Runtime:
        return runtime.build(spec)

    def program_code(self, lowered, offsets) -> tuple:
        from urewrite.arch.x86_64 import program_code
        return program_code.assemble(lowered, offsets)

    direct_calls = True

    def direct_entries(self, base, run_at, entries):
        from urewrite.arch.x86_64 import direct_entry
        return direct_entry.assemble(base, run_at, entries)

    def program_with_entries(self, lowered, offsets, run_at, entries):
        from urewrite.arch.x86_64 import direct_entry, program_code
        text, _ = program_code.source(lowered, offsets)
        bodies = [None if entry is None else
                  program_code.function_parts(f"i{k}", lowered.code[key], lowered, offsets) +
                  (program_code.quick_update(lowered.code[key], lowered, offsets,
                                             direct_entry.full_label(k)),)
                  for k, (entry, key) in enumerate(entries)]
        return direct_entry.assemble_with_code(text, run_at, [e for e, _ in entries], bodies)

    def direct_supported(self, entry) -> bool:
        from urewrite.arch.x86_64 import direct_entry
        return direct_entry.supported(entry)

    def registers_written(self, code, start, memo=None):
        from urewrite.arch.x86_64 import callback
        return callback.registers_written(self._full, code, start, memo)

    def callback_stubs(self, address, stubs, function) -> tuple:
        return callback.stubs(address, stubs, function)

    def context_read(self, code, start):
        return callback.context_read(self._full, code, start)

    def touches_unsaved_register(self, insn) -> bool:
        return callback.touches_unsaved_register(insn)


def _ip_relative(detail) -> bool:
    return any(op.type == x86.X86_OP_MEM and op.mem.base in (x86.X86_REG_RIP, x86.X86_REG_EIP)
               for op in detail.operands)
