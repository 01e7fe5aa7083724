"""The decoders agree with each other where the planner relies on it: a backend's quick
boundaries with its decode(), and on x86_64 the iced-x86 sweep and computed addresses
with Capstone's; a SweptCode's instructions with a whole decode."""

import os
import random
import re

import pytest

from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.base import Backend, Insn, NotAsSwept, SweptCode
from urewrite.arch.x86_64.backend import X86_64Backend
from urewrite.rewriter.pipeline import analyse

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.parametrize("backend", [X86_64Backend(), AArch64Backend()],
                         ids=["x86_64", "arm64"])
def test_boundaries_are_where_decode_puts_instructions(backend):
    rng = random.Random(13)
    samples = [b"", bytes.fromhex("4889e5" "0fb9c8" "c3"),  # a ud1 among ordinary ones
               bytes.fromhex("1f2003d5" "c0035fd6")]  # nop; ret (arm64)
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 48)))
                for _ in range(400)]  # stop at the first undecodable byte, as decode does
    for code in samples:
        insns = backend.decode(code, 0x4000)
        expected = [i.address for i in insns] + [insns[-1].end if insns else 0x4000]
        assert backend.boundaries(code, 0x4000) == expected, code.hex()


def test_arm64_decode_is_word_by_word():
    """arm64's decode() takes runs of words in one call to Capstone: the instructions
    of decoding each word alone, an undecodable one kept as .word (at the start, in the
    middle, at the end, several in a row), a last partial word left out."""
    backend = AArch64Backend()
    lite = backend.lite
    rng = random.Random(7)
    bad = bytes.fromhex("ffffffff")  # (no instruction)
    nop, ret = bytes.fromhex("1f2003d5"), bytes.fromhex("c0035fd6")
    samples = [b"", bad, bad + nop, nop + bad, nop + bad + bad + ret, bad * 3 + nop + b"\x01",
               nop + ret + b"\x00\x00"]
    samples += [b"".join(rng.choice((nop, ret, bad, bytes(rng.randrange(256) for _ in range(4))))
                         for _ in range(rng.randrange(1, 30))) + bytes(rng.randrange(4))
                for _ in range(300)]
    assert any(".word" in [i.mnemonic for i in backend.decode(c, 0)] for c in samples)
    for code in samples:
        expected = []
        for at in range(0, len(code) - 3, 4):
            word = code[at:at + 4]
            found = next(lite.disasm_lite(word, 0x4000 + at), None)
            expected.append((0x4000 + at, 4, found[2], found[3], word) if found else
                            (0x4000 + at, 4, ".word", word.hex(), word))
        assert [(i.address, i.size, i.mnemonic, i.op_str, i.raw)
                for i in backend.decode(code, 0x4000)] == expected, code.hex()


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_the_iced_sweep_is_capstones_on_libc():
    a = analyse(LIBC)
    backend = a.planner.backend
    compared = 0
    for fn in a.functions[::4]:  # (a quarter of them: Capstone's sweep is the slow one)
        offset = a.elf.offset_of(fn.address, max(fn.size, 1))
        if offset is None or not fn.size:
            continue
        code = a.elf.data[offset:offset + fn.size]
        fast, slow = backend.sweep(code, fn.address), Backend.sweep(backend, code, fn.address)
        for field in ("edges", "rows", "kinds", "targets"):
            assert getattr(fast, field).tolist() == getattr(slow, field).tolist(), \
                (fn.name, field)
        # what the planner may read decoded (Sweep.marked): every instruction that may
        # be refused or is a landing pad
        insns = backend.decode(code, fn.address)
        read = {k for k, insn in enumerate(insns)
                if backend.needs_detail(insn) or backend.landing_pad_size(insn)}
        assert read <= set(fast.marked.tolist()), fn.name
        compared += 1
    assert compared > 500


def _libc_functions(step: int):
    a = analyse(LIBC)
    for fn in a.functions[::step]:
        offset = a.elf.offset_of(fn.address, max(fn.size, 1))
        if offset is not None and fn.size:
            yield a, fn, a.elf.data[offset:offset + fn.size]


def _capstone_computed(insn):
    """The addresses an instruction computes, as Capstone's text shows them: lea from
    rip, mov of an immediate of 0x1000 or more to a register."""
    if insn.mnemonic == "lea":
        match = re.search(r"\[rip( [+-] (?:0x[0-9a-f]+|[0-9]+))?\]", insn.op_str)
        return insn.end + int((match.group(1) or "0").replace(" ", ""), 0) if match else None
    if insn.mnemonic in ("mov", "movabs"):
        match = re.match(r"[a-z0-9]+, (0x[0-9a-f]{4,})$", insn.op_str)
        return int(match.group(1), 16) if match else None
    return None


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_computed_addresses_are_those_capstone_shows_on_libc():
    compared = found = 0
    for a, fn, code in _libc_functions(2):
        backend = a.planner.backend
        expected = [x for x in map(_capstone_computed, backend.decode(code, fn.address))
                    if x is not None]
        assert backend.computed_addresses(code, fn.address) == expected, fn.name
        compared += 1
        found += len(expected)
    assert compared > 1000 and found > 2000


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_swept_code_decodes_what_is_read_as_a_whole_decode_does():
    compared = 0
    for a, fn, code in _libc_functions(3):
        backend = a.planner.backend
        sweep = backend.sweep(code, fn.address)
        whole = backend.decode(code, fn.address)
        if len(sweep) < 100 or [i.address for i in whole] != sweep.starts.tolist():
            continue
        calls = []

        def decode(part, address):
            calls.append(len(part))
            return backend.decode(part, address)

        lazy = SweptCode(sweep, decode, a.elf.read)
        assert len(lazy) == len(whole)
        k = len(whole) // 2
        assert lazy[k] == whole[k]
        assert len(calls) == 1 and calls[0] <= 15 * SweptCode.CHUNK  # (not the whole)
        assert lazy[k - 40:k + 2] == whole[k - 40:k + 2]
        assert lazy[-1] == whole[-1] and list(lazy) == whole
        # the sweep's branches: those a whole decode shows
        shown = {}
        for insn in whole:
            target = backend.direct_branch_target(insn)
            if target is not None:
                shown.setdefault(target, []).append(insn.address)
        assert sweep.branches() == shown, fn.name
        compared += 1
    assert compared > 100


def test_swept_code_refuses_what_the_decoder_sees_otherwise():
    backend = X86_64Backend()
    code = bytes.fromhex("4889e5" "0fb9c8" "c3")  # a ud1: its length differs between decoders
    sweep = backend.sweep(code, 0x4000)
    lazy = SweptCode(sweep, lambda part, address: backend.decode(part, address)[:1],
                     lambda address, size: code[address - 0x4000:address - 0x4000 + size])
    with pytest.raises(NotAsSwept):
        lazy[1]


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_a_branch_the_sweep_shows_is_one_the_detailed_decode_names():
    """BinaryModel.sweep_branches() answers for really_refers() without a detailed decode:
    where it says yes, that decode says yes too."""
    a = analyse(LIBC)
    planner, backend = a.planner, a.planner.backend
    said = 0
    for fn in a.functions[::10]:
        if not fn.size:
            continue
        sweep = planner.model.sweep(fn)
        for k in range(len(sweep)):
            start, end = int(sweep.edges[k]), int(sweep.edges[k + 1])
            insn = planner.model.insn_at(fn, start)
            if insn is None:
                continue
            target = backend.direct_branch_target(insn)
            for address in range(start, end):  # (a scan's match may lie inside)
                for t in {target, start + 5} - {None}:
                    if planner.model.sweep_branches(fn, address, t):
                        assert backend.names_address(insn, t), (fn.name, hex(start))
                        said += 1
            if target is not None:
                assert planner.model.sweep_branches(fn, start, target) or \
                    insn.mnemonic == "xbegin", (fn.name, hex(start))
    assert said > 2000


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_matches_judged_without_the_detailed_decode_are_judged_as_with_it():
    """_really_refers() asks no detailed decode where no field of 4 bytes or more can
    start at a match (_no_field_at) and of a branch match (the quick decoder's
    instruction): holds_constant() and names_address() would say the same of the
    detailed instruction, at every byte of every instruction of a sample of libc."""
    a = analyse(LIBC)
    planner, backend = a.planner, a.planner.backend
    no_field = named = 0
    for fn in a.functions[::7]:
        if not fn.size:
            continue
        sweep = planner.model.sweep(fn)
        for k in range(len(sweep)):
            start, end = int(sweep.edges[k]), int(sweep.edges[k + 1])
            detailed = planner.model.insn_at(fn, start)
            quick = planner.model.insn_at(fn, start, False)
            assert (detailed is None) == (quick is None), hex(start)
            if detailed is None:
                continue
            assert quick.raw == detailed.raw and quick.mnemonic == detailed.mnemonic
            for address in range(start, end):
                if planner.model.no_field_at(fn, address):
                    no_field += 1
                    for size in (4, 8):  # (the values a scan would match there)
                        if a.elf.offset_of(address, size) is not None:
                            value = int.from_bytes(a.elf.read(address, size), "little")
                            assert not backend.holds_constant(detailed, address - start,
                                                              value)
                else:  # (it says no more than it must: a field may start here)
                    assert address != start and address + 4 <= end
            for target in {backend.direct_branch_target(detailed), end + int.from_bytes(
                    detailed.raw[-4:], "little", signed=True)} - {None}:
                named += backend.names_address(quick, target)
                assert backend.names_address(quick, target) == \
                    backend.names_address(detailed, target), hex(start)
    assert no_field > 10_000 and named > 1_000


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
def test_direct_branches_made_without_decoding_are_as_decoded():
    """X86_64Backend.direct_branch() learns a mnemonic per opcode, then makes the
    instruction without Capstone: what Capstone would have made, on every direct branch
    and call of libc (each asked twice: learnt, then made)."""
    made = 0
    backend = X86_64Backend()
    for a, fn, code in _libc_functions(1):
        sweep = a.planner.model.sweep(fn)
        for k, target in zip(sweep.rows.tolist(), sweep.targets.tolist()):
            if target < 0:
                continue
            start, end = int(sweep.edges[k]), int(sweep.edges[k + 1])
            part = code[start - fn.address:end - fn.address]
            expected = backend.decode(part, start)
            for _ in range(2):
                insn = backend.direct_branch(part, start, target)
                assert insn is None or [insn] == expected, (fn.name, hex(start))
            made += insn is not None
    assert made > 50_000 and backend.branch_mnemonics


def _verdict(windows, insns) -> str:
    try:
        windows.displaced(insns)
        return "moves"
    except Exception as why:  # (Refused: its reason)
        return str(why)


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs Debian's x86_64 libc.so.6")
@pytest.mark.parametrize("shadow_stack", [False, True])
def test_windows_with_a_call_are_judged_as_in_detail(shadow_stack):
    """_displaced() judges a window whose only instructions that need detail are calls
    and jumps, direct or indirect, by the quick decode (Backend.quick_relocation_problem):
    the same verdict as the detailed decode gives, for windows of one to four
    instructions around every marked row (direct and indirect calls and jumps) of a
    sample of libc (calls last, calls before others), with and without the CET shadow
    stack."""
    a = analyse(LIBC)
    planner, backend = a.planner, a.planner.backend
    planner.windows.shadow_stack = shadow_stack
    quick = backend.quick_relocation_problem
    verdicts, answered, indirect = set(), 0, set()
    for fn in a.functions[::5]:
        if not fn.size:
            continue
        sweep = planner.model.sweep(fn)
        for k in sweep.marked.tolist():
            for first, last in ((k, k), (k - 1, k), (k - 2, k), (k, k + 1), (k - 1, k + 2)):
                if first < 0 or last >= len(sweep):
                    continue
                try:
                    insns = planner.model.rows(fn, first, last + 1)
                except Exception:
                    continue
                answered += all(quick(i, False, False) for i in insns
                                if backend.needs_detail(i))
                indirect.update(i.mnemonic for i in insns if backend.needs_detail(i) and
                                quick(i, False, False) and i.op_str[:1].isalpha())
                said = _verdict(planner.windows, insns)
                backend.quick_relocation_problem = lambda *_: None  # (the detailed way)
                try:
                    assert _verdict(planner.windows, insns) == said, (fn.name, first, last)
                finally:
                    del backend.quick_relocation_problem
                verdicts.add(said.split("'")[0])
    assert answered > 5_000
    assert {"moves", "cannot relocate "} <= verdicts or shadow_stack
    assert {"call", "jmp"} <= indirect  # (indirect ones among those judged quickly)


def test_a_call_relative_to_the_stack_pointer_is_asked_in_detail():
    """An indirect call whose target is read relative to the stack pointer is refused
    (its target moves with the call's emulation): the quick decode leaves it to the
    detailed one, which says so; one relative to another register moves."""
    backend = X86_64Backend()
    for code, said in ((bytes.fromhex("ff542408"), "takes its target relative to the stack"),
                       (bytes.fromhex("ff5008"), "moves"), (bytes.fromhex("ffd4"), "takes its"),
                       (bytes.fromhex("ffe4"), "moves")):  # [rsp+8]; [rax+8]; call rsp; jmp rsp
        insn = backend.decode(code, 0x4000)[0]
        windows = _bare_windows(_Bytes(0x4000, code), backend)
        assert backend.needs_detail(insn)
        assert (backend.quick_relocation_problem(insn, True, False) is None) == \
            ("sp" in insn.op_str and "call" in insn.mnemonic), insn
        assert said in _verdict(windows, [insn]), insn


def _bare_windows(elf, backend):
    """Windows of only what displaced() asks: the file, the backend, no shadow stack, no
    instruction lengths known yet."""
    from urewrite.rewriter.model import BinaryModel
    from urewrite.rewriter.plan.windows import Windows
    windows, model = Windows.__new__(Windows), BinaryModel.__new__(BinaryModel)
    windows.elf = model.elf = elf
    windows.backend = model.backend = backend
    windows.model, windows.shadow_stack, model.lengths = model, False, {}
    windows.go_faults = _NoGoCode()
    return windows


class _NoGoCode:
    """GoFaults of a file with no Go code: no window has a problem with it."""

    def problem(self, start: int, end: int):
        return None


class _Bytes:
    """The little of an ElfFile that _displaced() reads: code at an address."""

    def __init__(self, address: int, code: bytes):
        self.address, self.code = address, code

    def read(self, address: int, size: int) -> bytes:
        return self.code[address - self.address:address - self.address + size]


def test_a_window_with_a_call_the_decoders_see_otherwise_is_refused():
    """Judged by the quick decode or in detail, a window ending in a direct call is
    refused where the decoder that moves instructions sees them otherwise than the
    sweep (a ud1, which iced-x86 and Capstone read at different lengths)."""
    backend = X86_64Backend()
    code = bytes.fromhex("0fb9c8" "e800100000")  # ud1 eax, eax; call +0x1000
    sweep = backend.sweep(code, 0x4000)
    edges = sweep.edges.tolist()
    assert edges == [0x4000, 0x4003, 0x4008]  # (the sweep's lengths)
    call = backend.direct_branch(code[3:], 0x4003, 0x4003 + 5 + 0x1000)
    insns = [Insn(0x4000, 3, "", "", b""), call]  # (the sweep's unmarked row, its call)
    windows = _bare_windows(_Bytes(0x4000, code), backend)
    assert backend.quick_relocation_problem(call, True, False) == (None,)
    assert _verdict(windows, insns) == "its instructions at 0x4000 decode differently in detail"
    backend.quick_relocation_problem = lambda *_: None  # (the detailed way)
    assert _verdict(windows, insns) == "its instructions at 0x4000 decode differently in detail"


@pytest.mark.parametrize("backend", [X86_64Backend(), AArch64Backend()],
                         ids=["x86_64", "arm64"])
def test_lengths_learnt_at_once_are_each_strings_own(backend):
    """BinaryModel.learn_lengths() decodes many byte strings one after another in one call:
    what it keeps of each is what decoding it alone gives (instruction_ends), for
    windows of libc's code, a ud1 the decoders read apart, strings cut in the middle of
    an instruction, undecodable bytes and random bytes; most are learnt so."""
    from urewrite.rewriter.model import BinaryModel

    model = BinaryModel.__new__(BinaryModel)  # (only its lengths and backend are asked)
    model.lengths, model.backend = {}, backend
    rng = random.Random(5)
    codes = [bytes.fromhex("4889e5" "0fb9c8" "c3"), bytes.fromhex("4889e5" "0fb9"),
             bytes.fromhex("1f2003d5" "c0035fd6"), bytes.fromhex("1f2003d5" "c003"),
             bytes.fromhex("ffffffff"), bytes.fromhex("0f0b" "90"), b"\x90" * 3]
    if isinstance(backend, X86_64Backend) and os.path.exists(LIBC):
        a = analyse(LIBC)
        for fn in a.functions[::5]:
            sweep = a.planner.model.sweep(fn)
            edges = sweep.edges.tolist()
            for k in range(0, len(sweep), 3):
                last = min(k + rng.randrange(1, 5), len(sweep))
                codes.append(a.elf.read(edges[k], edges[last] - edges[k]))
    step = 1 if isinstance(backend, X86_64Backend) else 4  # (arm64: whole words, as code is)
    codes += [bytes(rng.randrange(256) for _ in range(step * rng.randrange(1, 24)))
              for _ in range(300)]
    rng.shuffle(codes)
    model.learn_lengths(codes)
    learnt = dict(model.lengths)
    for code in set(codes):
        model.lengths.pop(code, None)
        assert model.instruction_ends(code) == learnt.get(code, model.lengths[code]), \
            code.hex()
    assert len(learnt) > 0.5 * len(set(codes))
