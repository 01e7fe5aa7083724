"""The AArch64 backend: answers for arch/base.py's Backend."""

from __future__ import annotations

from typing import Optional

import capstone
import numpy as np

from urewrite.arch.aarch64 import (arguments, callback, fault_hook, faults, jump_tables, relocator,
                                   return_address, runtime, trampoline)
from urewrite.arch.aarch64.writer import b_imm
from urewrite.trampolines.arguments import C_CONVENTION
from urewrite.arch.base import (BRANCH, CALL, JUMP, OTHER, PLAIN, RETURN, Backend, Insn, Runtime,
                                RuntimeRefs, RuntimeSpec, Window)

# bti c / bti j / bti jc, paciasp, pacibsp: landing pads that stay where they are
_LANDING_PADS = {0xD503245F, 0xD503249F, 0xD50324DF, 0xD503233F, 0xD503237F}
_PADDING = {0xD503201F, 0x00000000}  # nop; udf #0 (what linkers fill gaps with)
_BRANCH_MNEMONICS = frozenset("b bl cbz cbnz tbz tbnz".split())


class AArch64Backend(Backend):
    name = "aarch64"
    elf_machine = 183
    patch_size = 4  # one b
    insn_alignment = 4
    branch_reach = (1 << 27) - 4  # b: +-128 MiB
    state_size = runtime.STATE_SIZE
    live_state = runtime.LIVE_STATE
    redirects_returns = True
    callback_flags = callback.FLAGS
    gnu_triplet = "aarch64-linux-gnu"
    shadow_stack_name = "the Guarded Control Stack (GCS)"

    def __init__(self):
        self.lite = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
        self._detailed = None  # (a decoder with details: made when first needed)

    # -- reading -----------------------------------------------------------
    def decode(self, code: bytes, address: int, detail: bool = False) -> list:
        # Fixed width: every 4 bytes is an instruction; an undecodable word
        # (data in code) is kept as ".word" so that boundaries stay exact. Capstone
        # decodes a run of words in one call, up to the first it cannot decode (a
        # word decodes alone: no instruction depends on the one before it).
        out, at, end = [], 0, len(code) // 4 * 4
        while at < end:
            for start, _, mnemonic, op_str in self.lite.disasm_lite(code[at:end], address + at):
                k = start - address
                out.append(Insn(start, 4, mnemonic, op_str, code[k:k + 4]))
            at = len(out) * 4
            if at < end:
                raw = code[at:at + 4]
                out.append(Insn(address + at, 4, ".word", raw.hex(), raw))
                at += 4
        return out

    def flow_kind(self, insn: Insn) -> tuple:
        word = int.from_bytes(insn.raw, "little")
        if word & 0xFFFFFBFF == 0xD65F0BFF or word & 0xFFFFFC1F == 0xD65F0000:
            return RETURN, None  # ret, retaa, retab
        if self.is_indirect_jump(insn):
            return OTHER, None
        target = self.direct_branch_target(insn)
        if target is None:
            return PLAIN, None
        return {"bl": CALL, "b": JUMP}.get(insn.mnemonic, BRANCH), target

    def landing_pad_size(self, first: Insn) -> int:
        return 4 if int.from_bytes(first.raw, "little") in _LANDING_PADS else 0

    def direct_branch_target(self, insn: Insn) -> Optional[int]:
        mnemonic = insn.mnemonic.split(".")[0]
        if mnemonic in _BRANCH_MNEMONICS:
            target = insn.op_str.rsplit("#", 1)[-1]
            return int(target, 16) if target.startswith("0x") else None
        return None

    def code_reference_table(self, code: bytes, base: int) -> tuple:
        words = np.frombuffer(code[:len(code) // 4 * 4], dtype="<u4").astype(np.int64)
        offsets = _pc_relative_offsets(words)
        k = np.flatnonzero(offsets != _NO_OFFSET)
        return base + 4 * k, base + 4 * k + offsets[k]

    def names_address(self, insn: Insn, target: int) -> bool:
        offset = _pc_relative_offset(int.from_bytes(insn.raw, "little"))
        return offset is not None and insn.address + offset == target

    def holds_constant(self, insn: Insn, offset: int, value: int) -> bool:
        # No instruction carries a 32-bit field: 4 matching bytes in code are data (a
        # literal pool) or straddle two words, and the two cannot be told apart here.
        return True

    def exit_kind(self, insn: Insn, inside) -> tuple:
        word = int.from_bytes(insn.raw, "little")
        if word & 0xFFFFFBFF == 0xD65F0BFF or word & 0xFFFFFC1F == 0xD65F0000:
            return True, None  # ret, retaa, retab
        if insn.mnemonic == "br":  # an exit when it goes outside (checked in the trampoline)
            return "outside", None
        if self.is_indirect_jump(insn):  # braa, brab, braaz, brabz (blr* are calls)
            return False, f"the indirect branch at {insn.address:#x} may leave it"
        target = self.direct_branch_target(insn)
        if target is None or inside(target) or insn.mnemonic == "bl":
            return False, None
        if insn.mnemonic == "b":
            return True, None  # a tail call
        return "taken", None  # a conditional tail call (b.cond, cbz, tbz ...): when taken

    def is_indirect_jump(self, insn: Insn) -> bool:
        return insn.mnemonic in ("br", "braa", "brab", "braaz", "brabz")

    def jump_tables(self, insns: list, indexes: list, read) -> list:
        return jump_tables.jump_tables(self, insns, indexes, read)

    def return_value(self, convention=C_CONVENTION, returned: bool = False) -> list:
        return arguments.abi_return(convention, returned)

    def is_call_frame(self, frame) -> bool:
        # CFA = sp, the return address still in x30: what `bl` leaves (DWARF sp = 31)
        return (frame.cfa_register, frame.cfa_offset, frame.return_address) == \
            (31, 0, ("same",))

    def return_redirect_problem(self, code: bytes, address: int) -> Optional[str]:
        return return_address.problem(code, address)

    def is_padding(self, insn: Insn) -> bool:
        return int.from_bytes(insn.raw, "little") in _PADDING

    def ends_flow(self, insn: Insn) -> bool:
        # ret/retaa/retab, b, br/braa..., udf, brk: never continue to the next word
        word = int.from_bytes(insn.raw, "little")
        indirect = word & 0xFE1F0000 == 0xD61F0000 and not word >> 21 & 1  # not blr*
        return (indirect or word & 0xFC000000 == 0x14000000
                or word & 0xFFFF0000 == 0 or word & 0xFFE0001F == 0xD4200000)

    # -- can I? ------------------------------------------------------------
    def relocation_problem(self, insn: Insn, is_last: bool, shadow_stack: bool) -> Optional[str]:
        if insn.mnemonic == ".word":
            return f"the word {insn.op_str} does not decode as an instruction"
        return relocator.relocation_problem(insn, is_last, shadow_stack)

    translates_faults = True

    def moved_instructions(self, address: int, window: Window, points,
                           refs: RuntimeRefs) -> list:
        return trampoline.moved_instructions(address, window, points, refs)

    def fault_hook(self, address: int, window: Window, moved) -> bytes:
        return fault_hook.build(address, window, moved)

    def may_fault(self, insn: Insn, g_in_register: bool) -> bool:
        return faults.may_fault(insn, g_in_register)

    def flags_live_at_entry(self) -> bool:
        return False  # and the trampoline never changes the flags anyway

    # -- writing -----------------------------------------------------------
    def site_patch(self, window: Window, trampoline_address: int) -> bytes:
        return b_imm(window.address, trampoline_address).to_bytes(4, "little")

    def trampoline(self, address: int, window: Window, points, refs: RuntimeRefs) -> bytes:
        return trampoline.build(address, window, points, refs)

    def sdt_arguments(self, text: str, symbol) -> list:
        return arguments.sdt_arguments(text, symbol)

    def abi_arguments(self, count: int, convention=C_CONVENTION) -> list:
        return arguments.abi_arguments(count, convention)

    def runtime(self, spec: RuntimeSpec) -> Runtime:
        return runtime.build(spec)

    def program_code(self, lowered, offsets) -> tuple:
        from urewrite.arch.aarch64 import program_code
        return program_code.assemble(lowered, offsets)

    direct_calls = True

    def direct_entries(self, base, run_at, entries):
        from urewrite.arch.aarch64 import direct_entry
        return direct_entry.assemble(base, run_at, entries)

    def direct_supported(self, entry) -> bool:
        from urewrite.arch.aarch64 import direct_entry
        return direct_entry.supported(entry)

    def context_read(self, code, start):
        if self._detailed is None:
            self._detailed = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
            self._detailed.detail = True
        return callback.context_read(self._detailed, code, start)

    def callback_stubs(self, address, stubs, function) -> tuple:
        return callback.stubs(address, stubs, function)

    def touches_unsaved_register(self, insn) -> bool:
        return callback.touches_unsaved_register(insn)


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) else value


def _pc_relative_offset(word: int) -> Optional[int]:
    """The offset a B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ or ADR word adds to its address."""
    if word & 0x7C000000 == 0x14000000:  # b, bl
        return 4 * _signed(word & 0x3FFFFFF, 26)
    if word & 0xFF000010 == 0x54000000 or word & 0x7E000000 == 0x34000000:  # b.cond, cbz
        return 4 * _signed(word >> 5 & 0x7FFFF, 19)
    if word & 0x7E000000 == 0x36000000:  # tbz, tbnz
        return 4 * _signed(word >> 5 & 0x3FFF, 14)
    if word & 0x9F000000 == 0x10000000:  # adr
        return _signed((word >> 5 & 0x7FFFF) << 2 | word >> 29 & 3, 21)
    return None


_NO_OFFSET = 1 << 40  # no PC-relative offset is this large


def _pc_relative_offsets(words):
    """_pc_relative_offset for a numpy array of words at once: _NO_OFFSET where none."""
    def signed(value, bits):
        return np.where(value >> (bits - 1) & 1, value - (1 << bits), value)
    return np.select(
        [words & 0x7C000000 == 0x14000000,
         (words & 0xFF000010 == 0x54000000) | (words & 0x7E000000 == 0x34000000),
         words & 0x7E000000 == 0x36000000,
         words & 0x9F000000 == 0x10000000],
        [4 * signed(words & 0x3FFFFFF, 26),
         4 * signed(words >> 5 & 0x7FFFF, 19),
         4 * signed(words >> 5 & 0x3FFF, 14),
         signed((words >> 5 & 0x7FFFF) << 2 | words >> 29 & 3, 21)],
        _NO_OFFSET)
