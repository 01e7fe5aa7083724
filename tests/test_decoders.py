"""The decoders agree with each other where the planner relies on it: a backend's quick
boundaries with its decode(), and on x86_64 the iced-x86 sweep with Capstone's."""

import os
import random

import pytest

from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.base import Backend
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
