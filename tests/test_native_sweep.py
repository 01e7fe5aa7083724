"""The native x86_64 sweep (arch/x86_64/native, Rust) makes the very arrays the Python
loop over iced-x86 makes: on every function of system files, on hand-made branches
of every kind, on random bytes, and where neither can decode."""

import os
import random

import keystone
import numpy as np
import pytest

from urewrite.arch.base import Sweep
from urewrite.arch.x86_64 import linear_sweep, return_address
from urewrite.arch.x86_64.backend import X86_64Backend
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import discover

pytestmark = pytest.mark.skipif(
    linear_sweep.native_sweep is None,
    reason="the native sweep was not built (no Rust toolchain at install time)")

FIELDS = Sweep.__slots__
SYSTEM_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11", "/usr/bin/bash",
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"]


class Undecodable:
    """Stands for Capstone's sweep where iced-x86 cannot decode: says what it was given."""

    def __init__(self):
        self.asked = []

    def __call__(self, code: bytes, address: int) -> Sweep:
        self.asked.append((code, address))
        empty = np.zeros(0, np.int64)
        return Sweep(np.array([address, -len(self.asked)], np.int64), empty,
                     np.zeros(0, np.uint8), empty, empty)


def same(a: Sweep, b: Sweep) -> bool:
    return all(getattr(a, f).dtype == getattr(b, f).dtype and
               getattr(a, f).tolist() == getattr(b, f).tolist() for f in FIELDS)


def both(spans, data: bytes):
    """(native sweeps of the spans, the Python loop's), each with its fallback's log."""
    native_log, python_log = Undecodable(), Undecodable()
    native = linear_sweep.native_sweeps(data, spans, native_log).sweeps
    python = [linear_sweep.python_sweep(data[o:o + s], a, python_log) for o, s, a in spans]
    return native, python, native_log.asked, python_log.asked


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=os.path.basename)
def test_every_function_of_a_system_file(path):
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    elf = ElfFile.open(path)
    spans = []
    for fn in discover(elf):
        offset = elf.offset_of(fn.address, max(fn.size, 1))
        spans.append((offset, fn.size, fn.address) if offset is not None else (0, 0, fn.address))
    native, python, native_asked, python_asked = both(spans, elf.data)
    assert len(native) == len(python) == len(spans) > 1000
    differ = [hex(a) for (_, _, a), n, p in zip(spans, native, python) if not same(n, p)]
    assert not differ, differ[:10]
    assert native_asked == python_asked
    assert sum(len(s) for s in native) > 100_000


# one instruction each, and what the sweep makes of it (kind, target) or None: plain
CASES = [
    ("e8 00 00 00 00", ("CALL", 0x1005)),  # call rel32
    ("e9 fb ff ff ff", ("JUMP", 0x1000)),  # jmp rel32
    ("eb fe", ("JUMP", 0x1000)),  # jmp rel8
    ("74 02", ("BRANCH", 0x1004)),  # je rel8
    ("0f 85 00 01 00 00", ("BRANCH", 0x1106)),  # jne rel32
    ("c3", ("RETURN", -1)),  # ret
    ("c2 08 00", ("RETURN", -1)),  # ret imm16
    ("cb", ("OTHER", -1)),  # retf: no near return
    ("e2 fe", ("OTHER", 0x1000)),  # loop: counted, refused as an exit
    ("e3 10", ("OTHER", 0x1012)),  # jrcxz
    ("67 e3 10", ("OTHER", 0x1013)),  # jecxz
    ("c7 f8 10 00 00 00", ("CALL", 0x1016)),  # xbegin: its abort path goes to its target
    ("0f 05", None),  # syscall
    ("ff d0", None),  # call rax
    ("ff e0", ("OTHER", -1)),  # jmp rax
    ("3e ff e0", ("OTHER", -1)),  # notrack jmp rax
    ("ff 24 c5 00 10 00 00", ("OTHER", -1)),  # jmp [rax*8 + 0x1000]
    ("ff 28", ("OTHER", -1)),  # jmp far [rax]
    ("cc", None),  # int3
    ("0f 0b", None),  # ud2
    ("66 e9 fa ff ff ff", ("JUMP", 0x1000)),  # o16 jmp: rel32 all the same (Intel's)
    ("eb 80", ("JUMP", 0x1000 + 2 - 128)),
    ("e9 00 e0 ff ff", ("JUMP", -0x1000 + 5)),  # below address 0: wrapped as int64
    ("f2 e9 fa ff ff ff", ("JUMP", 0x1000)),  # bnd jmp
    ("48 89 e5", None),  # mov rbp, rsp
    ("f3 0f 1e fa", None),  # endbr64: a landing pad, marked
    ("b8 f3 0f 1e fa", None),  # mov eax, imm: the pad's bytes inside, marked all the same
]


@pytest.mark.parametrize("hex_code,expected", CASES, ids=[c for c, _ in CASES])
def test_each_kind_of_instruction(hex_code, expected):
    from urewrite.arch import base
    code = bytes.fromhex(hex_code)
    # (between two plain instructions: rows and marks must count them)
    data = bytes.fromhex("90") + code + bytes.fromhex("90")
    native, python, _, _ = both([(1, len(code), 0x1000), (0, len(data), 0xfff)], data)
    assert same(native[0], python[0]) and same(native[1], python[1])
    alone = native[0]
    assert alone.edges.tolist() == [0x1000, 0x1000 + len(code)]
    if expected is None:
        assert alone.rows.tolist() == []
    else:
        kind, target = expected
        assert (alone.rows.tolist(), alone.kinds.tolist(), alone.targets.tolist()) == \
            ([0], [getattr(base, kind)], [target])
    pad = b"\xf3\x0f\x1e\xfa" in code
    branches = expected is not None and hex_code not in ("c3", "c2 08 00", "cb")  # (returns)
    calls = hex_code in ("ff d0", "0f 05")  # (read in detail: they may be refused)
    assert alone.marked.tolist() == ([0] if pad or branches or calls else [])
    assert native[1].edges.tolist()[:2] == [0xfff, 0x1000]


def test_random_bytes():
    rng = random.Random(17)
    data = bytes(rng.randrange(256) for _ in range(200_000))
    spans = []
    while len(spans) < 3000:
        offset = rng.randrange(len(data) - 64)
        spans.append((offset, rng.randrange(0, 64), 0x400000 + offset))
    native, python, native_asked, python_asked = both(spans, data)
    assert all(same(n, p) for n, p in zip(native, python))
    # random bytes meet undecodable ones: both leave the same functions to the fallback
    assert native_asked == python_asked and len(native_asked) > 100


def test_where_iced_cannot_decode_the_fallback_sweeps():
    """An undecodable instruction (push es: none in 64-bit code) hands the whole function
    to the fallback; the functions around it are swept as usual."""
    data = bytes.fromhex("c3" "55 06 c3" "e8 00 00 00 00")
    log = Undecodable()
    batch = linear_sweep.native_sweeps(data, [(0, 1, 0x10), (1, 3, 0x11), (4, 5, 0x14)], log)
    first, broken, last = batch.sweeps
    assert log.asked == [(bytes.fromhex("55 06 c3"), 0x11)]
    assert broken.edges.tolist() == [0x11, -1]  # (the fallback's)
    assert first.edges.tolist() == [0x10, 0x11] and first.kinds.tolist() == [base_kind("RETURN")]
    assert last.edges.tolist() == [0x14, 0x19] and last.targets.tolist() == [0x19]
    # where each lies in the batch's arrays: the broken one in none
    assert batch.spans.tolist() == [[0, 2, 0, 1, 0, 0], [0, -1, 0, 0, 0, 0], [2, 2, 1, 1, 0, 1]]
    assert np.frombuffer(batch.edges, np.int64).tolist() == [0x10, 0x11, 0x14, 0x19]
    assert np.frombuffer(batch.targets, np.int64).tolist() == [-1, 0x19]
    assert np.frombuffer(batch.marked, np.int64).tolist() == [0]


def test_a_function_with_no_bytes():
    native, python, _, _ = both([(0, 0, 0x2000)], b"\x90")
    assert native[0].edges.tolist() == python[0].edges.tolist() == [0x2000]
    assert len(native[0]) == 0


def test_the_backend_sweeps_all_at_once_or_says_it_cannot(monkeypatch):
    backend = X86_64Backend()
    data = bytes.fromhex("c3" "90 c3")
    made = backend.sweep_all(data, [(0, 1, 0x10), (1, 2, 0x11)])
    assert [s.edges.tolist() for s in made.sweeps] == [[0x10, 0x11], [0x11, 0x12, 0x13]]
    monkeypatch.setattr(linear_sweep, "native_sweep", None)
    assert backend.sweep_all(data, [(0, 1, 0x10)]) is None
    assert backend.sweep(data[1:], 0x11).edges.tolist() == [0x11, 0x12, 0x13]


def test_a_native_panic_falls_back_to_the_python_sweep(monkeypatch, capsys):
    """A panic in the native sweep (pyo3's PanicException, a BaseException) leaves the
    sweeping to Python, with a warning; any other error is raised as it was."""
    class PanicException(BaseException):
        pass

    def panics(*_args):
        raise PanicException("a sweep thread panicked: boom")
    backend = X86_64Backend()
    monkeypatch.setattr(linear_sweep, "native_sweeps", panics)
    assert backend.sweep_all(b"\xc3", [(0, 1, 0x10)]) is None
    assert "native sweep failed (a sweep thread panicked: boom); sweeping in Python" \
        in capsys.readouterr().err

    def fails(*_args):
        raise ValueError("not a panic")
    monkeypatch.setattr(linear_sweep, "native_sweeps", fails)
    with pytest.raises(ValueError):
        backend.sweep_all(b"\xc3", [(0, 1, 0x10)])


def base_kind(name: str) -> int:
    from urewrite.arch import base
    return getattr(base, name)


def test_the_planner_sweeps_every_function_at_once_as_one_by_one():
    """BinaryModel.sweep_all (before prepare's fork) finds each function's bytes as code()
    does, functions outside the file's bytes included."""
    from urewrite.rewriter.pipeline import analyse
    path = SYSTEM_FILES[0]
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    planner = analyse(path).planner
    functions = planner.functions
    assert planner.model.sweep_all(functions)
    one_by_one = [planner.backend.sweep(planner.model.code(fn), fn.address) for fn in functions]
    assert all(same(planner.model.sweeps[fn.address], s) for fn, s in zip(functions, one_by_one))


@pytest.mark.parametrize("path", SYSTEM_FILES[:2], ids=os.path.basename)
def test_computed_addresses_are_the_python_loops(path):
    """The addresses a function computes (rip-relative lea, mov of an immediate to a
    register), found by the native module, are those the loop over the Python package
    finds: on every function of system files, and on random bytes."""
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    elf = ElfFile.open(path)
    backend = X86_64Backend()
    found = 0
    for fn in discover(elf):
        if not fn.size:
            continue
        code = elf.read(fn.address, fn.size)
        native = backend.computed_addresses(code, fn.address)
        assert native == backend.python_computed_addresses(code, fn.address), fn.name
        found += len(native)
    assert found > 1000
    rng = random.Random(7)
    for _ in range(200):
        code = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        address = rng.randrange(1 << 47)
        assert backend.computed_addresses(code, address) == \
            backend.python_computed_addresses(code, address)


def test_a_big_batch_on_several_threads_is_one_function_at_a_time():
    """A batch of more than a few megabytes is swept in runs, one thread each, joined in
    order: the same sweeps, arrays and spans as each function swept alone (and the
    fallback asked for the same functions, in the same order)."""
    elf = ElfFile.open("/lib/x86_64-linux-gnu/libc.so.6")
    spans = []
    for fn in discover(elf):
        offset = elf.offset_of(fn.address, max(fn.size, 1))
        if offset is not None:
            spans.append((offset, fn.size, fn.address))
    rng = random.Random(5)
    data = elf.data + bytes(rng.randrange(256) for _ in range(1 << 16))
    junk = [(len(elf.data) + rng.randrange(0, 1 << 15), rng.randrange(1, 512), 0x900000 + k)
            for k in range(200)]  # (some undecodable: the fallback's, in the right order)
    spans = spans * 3 + junk + spans
    spans = rng.sample(spans, len(spans))
    assert sum(size for _, size, _ in spans) > 5 << 20  # (several runs)
    batch_log, alone_log = Undecodable(), Undecodable()
    batch = linear_sweep.native_sweeps(data, spans, batch_log)
    alone = [linear_sweep.native_sweeps(data, [span], alone_log).sweeps[0] for span in spans]
    assert all(same(b, a) for b, a in zip(batch.sweeps, alone))
    assert batch_log.asked == alone_log.asked and len(batch_log.asked) > 20
    edges, rows, marked = (np.frombuffer(b, np.int64)
                           for b in (batch.edges, batch.rows, batch.marked))
    for s, (e, ne, r, nr, m, nm) in zip(batch.sweeps, batch.spans.tolist()):
        if ne >= 0:  # (where each lies in the joined arrays)
            assert edges[e:e + ne].tolist() == s.edges.tolist()
            assert rows[r:r + nr].tolist() == s.rows.tolist()
            assert marked[m:m + nm].tolist() == s.marked.tolist()


KS64 = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
FUNCTION = 0x401000


def _assembled(text: str) -> bytes:
    """Code at FUNCTION; a leading endbr64, which Keystone does not know, as bytes."""
    if text.startswith("endbr64; "):
        return linear_sweep.ENDBR64 + bytes(KS64.asm(text[9:], FUNCTION + 4)[0])
    return bytes(KS64.asm(text, FUNCTION)[0])


@pytest.mark.parametrize("path", SYSTEM_FILES[:2], ids=os.path.basename)
def test_return_address_problems_are_the_python_walks(path):
    """Whether a function reads its own return address, found by the native module's
    walk over iced-x86's decode, is what the Python walk over Capstone's finds, in the
    same words: on every function of system files (nearly all answered natively), and
    on random bytes."""
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    elf = ElfFile.open(path)
    native = problems = 0
    for fn in discover(elf):
        if not fn.size:
            continue
        code = elf.read(fn.address, fn.size)
        expected = return_address.python_problem(code, fn.address)
        assert return_address.problem(code, fn.address) == expected, fn.name
        native += linear_sweep.native_sweep.return_address_problem(code, fn.address) is not None
        problems += expected is not None
    assert problems > 10 and native > 3000
    rng = random.Random(11)
    for _ in range(300):
        code = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 120)))
        assert return_address.problem(code, FUNCTION) == \
            return_address.python_problem(code, FUNCTION)


@pytest.mark.parametrize("text, problem", [
    ("push rbx; mov rbx, rdi; pop rbx; ret", None),
    ("endbr64; push rbp; mov rbp, rsp; mov rax, [rbp + 8]; pop rbp; ret", "reads"),
    ("push rbp; mov rbp, rsp; mov rax, [rbp + 16]; pop rbp; ret", None),
    ("push rbx; sub rsp, 0x20; mov rax, [rsp + 0x28]; add rsp, 0x20; pop rbx; ret", "reads"),
    ("push rbx; sub rsp, 0x20; mov rax, [rsp + 0x20]; add rsp, 0x20; pop rbx; ret", None),
    ("lea rsp, [rsp - 0x18]; mov rax, [rsp + 0x18]; ret", "reads"),
    ("add rsp, -8; mov rax, [rsp + 8]; ret", "reads"),
    ("pop rax; jmp rax", "pops"),
    ("push rbx; pop rbx; pop rax; jmp rax", "pops"),
    # both ways from a conditional branch, the depth each path has
    ("test edi, edi; je away; push rax; pop rax; ret; away: mov rax, [rsp]; ret", "reads"),
    ("test edi, edi; je away; push rax; mov rax, [rsp]; pop rax; ret; away: ret", None),
    ("test edi, edi; jne 0x401000; ret", "jumps back"),
    ("endbr64; test edi, edi; jne 0x401004; ret", "jumps back"),
    ("call 0x402000; mov rax, [rsp]; ret", "reads"),
    # rsp set from elsewhere: the depth is unknown from there
    ("mov rsp, rbp; mov rax, [rsp]; ret", None),
    ("and rsp, -16; mov rax, [rsp]; ret", None),
    ("cmp rsp, rax; mov rax, [rsp]; ret", "reads"),
    ("ret; mov rax, [rsp]", None),
    ("jmp rax; mov rax, [rsp]", None),
    ("syscall; mov rax, [rsp]", None),
    ("int3; mov rax, [rsp]", None),
    ("ud2; mov rax, [rsp]", "reads"),
])
def test_return_address_walks_by_hand(text, problem):
    """Hand-made functions, each rule of the walk: the native answer, in the Python
    walk's words, and the kind of problem."""
    code = _assembled(text)
    assert linear_sweep.native_sweep.return_address_problem(code, FUNCTION) is not None
    found = return_address.problem(code, FUNCTION)
    assert found == return_address.python_problem(code, FUNCTION)
    assert (found is None) if problem is None else (problem in found), found


@pytest.mark.parametrize("code", [
    b"\x85\xff" b"\xc7\xf8\x01\x00\x00\x00" b"\xc3" b"\xc3",  # xbegin (Capstone: a jump)
    b"\x48\xff\x28" b"\xc3",  # jmp far [rax]
    b"\x48\x89\xf8" b"\x06" b"\xc3",  # mov rax, rdi; an opcode iced-x86 refuses; ret
])
def test_return_address_walks_left_to_python(code):
    """Flow that the native walk does not mirror, and opcodes iced-x86 refuses before
    the end (Capstone takes some), are left to the Python walk."""
    assert linear_sweep.native_sweep.return_address_problem(code, FUNCTION) is None
    assert return_address.problem(code, FUNCTION) == return_address.python_problem(code, FUNCTION)


def test_return_address_walk_of_code_cut_mid_instruction():
    """Code that ends inside an instruction (a size that cuts it): both decoders stop
    there, and the native walk answers."""
    code = _assembled("push rbx; mov rax, [rsp + 8]; pop rbx; ret; mov rax, 0x1234567890")[:-3]
    assert linear_sweep.native_sweep.return_address_problem(code, FUNCTION) is not None
    assert "reads" in return_address.problem(code, FUNCTION)
    assert return_address.problem(code, FUNCTION) == return_address.python_problem(code, FUNCTION)
