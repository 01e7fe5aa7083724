"""Two shortcuts of the x86_64 trampoline maker give the bytes the long way gives:
the counting code of a point copied from its shape's template (not written out),
and windows of instructions that run anywhere copied (not decoded in detail)."""

import itertools
import os
import shutil
import subprocess

import capstone
import pytest
from capstone import x86_const as X

from urewrite.arch.base import CountPoint, RuntimeRefs, Window
from urewrite.arch.x86_64 import relocator, trampoline
from urewrite.arch.x86_64.backend import X86_64Backend
from urewrite.rewriter import pipeline
from urewrite.rewriter.elf_file import ElfFile

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
REFS = RuntimeRefs(0x900000, 0x1240, 0x700100, 0x700200, 0x700300, 0x700400, 0x700500,
                   shadow_push=0x700600, shadow_pop=0x700700)
# push rbp ; mov rbp, rsp ; cmp qword ptr [rip + 0x2000], 0 ; jne +0x40 ; sub rsp, 0x10
CODE = bytes.fromhex("55" "4889e5" "48833d0020000000" "7540" "4883ec10")


def _written_out(w, c, L, point, refs):
    """The counting code of a point, written instruction by instruction."""
    trampoline.armed_path(w, c, L, point, refs)
    trampoline.trace_path(c, L, point.probes, refs, point.arguments, trampoline.red_zone(point))


def _points(insns, shape):
    flags_live, probes, enters, leaves, redirect, arguments = shape
    at = [i.address for i in insns]
    back = CountPoint(0, (probes + 7,), False, (), False, (leaves + 2,)) if redirect else None
    return [CountPoint(at[0], tuple(range(3, 3 + probes)), False, arguments[:probes], enters,
                       tuple(range(9, 9 + leaves)), back),
            # (a point inside: its labels must not meet the first one's)
            CountPoint(at[2], (probes * 100 + 1,), flags_live, arguments[probes:], False,
                       tuple(range(40, 40 + leaves)))]


SHAPES = list(itertools.product(
    (False, True), (1, 2, 3), (False, True), (0, 1, 2), (False, True),
    ((), (b"\x01\x02\x03",), (b"\x05" * 11, b"", b"\x07" * 3, b"\x09"))))


@pytest.mark.parametrize("address", [0x40001000, 0x40001008, 0x40001003])
def test_counting_code_from_a_template_is_the_code_written_out(address, monkeypatch):
    insns = X86_64Backend().decode(CODE, 0x401000, detail=True)
    window = Window(0x401000, len(CODE), tuple(insns))
    made = []
    for shape in SHAPES:
        points = _points(insns, shape)
        made.append(trampoline.build(address, window, points, REFS))
    assert trampoline.counting_template.cache_info().hits > 0  # (templates were used)
    monkeypatch.setattr(trampoline, "counting", _written_out)
    for shape, code in zip(SHAPES, made):
        assert trampoline.build(address, window, _points(insns, shape), REFS) == code, shape


def test_a_template_out_of_branch_reach_fails_as_written_out(monkeypatch):
    insns = X86_64Backend().decode(CODE, 0x401000, detail=True)
    window = Window(0x401000, len(CODE), tuple(insns))
    far = 0x400000000  # (the runtime's routines 16 GB away)
    with pytest.raises(OverflowError):
        trampoline.build(far, window, _points(insns, SHAPES[0]), REFS)
    monkeypatch.setattr(trampoline, "counting", _written_out)
    with pytest.raises(OverflowError):
        trampoline.build(far, window, _points(insns, SHAPES[0]), REFS)


def _depends_on_its_address(insn) -> bool:
    """From Capstone's detailed decode: a branch of any kind, or a RIP-relative operand."""
    d = insn
    branchy = d.id in relocator._BRANCHES or d.id in (X.X86_INS_LJMP, X.X86_INS_LCALL) or any(
        d.group(g) for g in (X.X86_GRP_JUMP, X.X86_GRP_CALL, X.X86_GRP_RET, X.X86_GRP_IRET,
                             X.X86_GRP_BRANCH_RELATIVE))
    return branchy or any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP
                          for op in d.operands)


@pytest.mark.skipif(not os.path.exists(LIBC), reason="needs the system's libc")
def test_instructions_taken_as_verbatim_depend_on_no_address():
    """The instructions of 384 KB of libc's code (35,000): those taken to run anywhere
    as they are have no branch but a near return and no RIP-relative operand in
    detail; and most plain instructions and every near return are taken so (else the
    shortcut would not be tried)."""
    elf = ElfFile.open(LIBC)
    backend = X86_64Backend()
    full = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    full.detail = True
    taken = plain = returns = 0
    text = elf.section_named(".text")
    for start in range(text.addr, min(text.end, text.addr + (6 << 16)), 1 << 16):
        code = elf.read(start, min(1 << 16, text.end - start))
        quick = backend.decode(code, start)
        detailed = full.disasm(code, start)
        for light, insn in zip(quick, detailed):
            assert (light.address, light.size) == (insn.address, insn.size)
            moving = _depends_on_its_address(insn)
            near_return = insn.id == X.X86_INS_RET
            if backend.moves_verbatim(light):
                assert near_return or not moving, hex(insn.address)
                taken += not near_return
            else:
                assert not near_return, hex(insn.address)
            plain += not moving
            returns += near_return
    assert taken > 0.95 * plain > 30000 and returns > 500, (taken, plain, returns)


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_windows_copied_verbatim_make_the_same_file(opt, tmp_path, monkeypatch):
    """A rewrite with every entry and return probed: the same file with the shortcut
    as with every window decoded in detail."""
    program = tmp_path / "edges"
    subprocess.run(["gcc", opt, os.path.join(SAMPLES, "edges.c"), "-o", program], check=True)
    outputs, verbatim = [], []
    real = X86_64Backend.moves_verbatim
    for allowed in (True, False):
        def counted(self, insn, allowed=allowed):
            verbatim.append(real(self, insn))
            return allowed and verbatim[-1]
        monkeypatch.setattr(X86_64Backend, "moves_verbatim", counted)
        out = tmp_path / str(allowed) / "probed"  # (the same name: it is in the file)
        out.parent.mkdir()
        result = pipeline.rewrite(str(program), str(out), ["*"], keep_going=True,
                                  return_specs=["*"])
        assert result.plans
        outputs.append(out.read_bytes())
    assert any(verbatim) and not all(verbatim)
    assert outputs[0] == outputs[1]
