"""x86_64 trampolines laid out hot and cold (rewriter/segment.py, COLD_BLOCK): what a
counting hit runs of a block of trampolines lies together, the rest of theirs after
them. A program of 100 probed functions: the places its sites jump to, the hot parts,
are packed (whole trampolines of this shape take half as much room again), every cold
part lies after its block's hot parts, and the program counts every call exactly."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import rewrite, run, stat
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.segment import COLD_BLOCK

FUNCTIONS = 100
pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def _source() -> str:
    functions = "".join(f"__attribute__((noipa)) long work_{i}(long x) {{ return x * {i} + sink; }}\n"
                        for i in range(FUNCTIONS))
    calls = "".join(f"    for (int k = 0; k < {i % 5 + 1}; k++) s += work_{i}(k);\n"
                    for i in range(FUNCTIONS))
    return ("#include <stdio.h>\nstatic volatile long sink;\n" + functions +
            "int main(void) {\n    long s = 0;\n" + calls +
            '    printf("%ld\\n", s);\n    return 0;\n}\n')


def test_hot_parts_lie_together(tmp_path):
    source, plain, probed = tmp_path / "many.c", tmp_path / "many", tmp_path / "many.probed"
    source.write_text(_source())
    subprocess.run(["gcc", "-O2", "-fcf-protection=none", str(source), "-o", str(plain)],
                   check=True)
    result = rewrite(plain, probed, "work_*")
    assert len(result["probes"]) == FUNCTIONS and {p["tactic"] for p in result["probes"]} == {"jump"}
    elf = ElfFile.open(str(probed))
    hot = []  # where each site's jump goes: its trampoline's hot part
    for p in result["probes"]:
        site = elf.read(p["address"], 5)
        assert site[0] == 0xE9
        hot.append(p["address"] + 5 + int.from_bytes(site[1:], "little", signed=True))
    hot.sort()
    symbols = subprocess.run(["nm", str(probed)], capture_output=True, text=True).stdout
    parts = sorted(int(line.split()[0], 16) for line in symbols.splitlines()
                   if line.endswith(".urewrite") and line.split()[2].startswith("work_"))
    assert len(parts) == 2 * FUNCTIONS  # a symbol for each part of each trampoline
    cold = sorted(set(parts) - set(hot))
    first_block = hot[:COLD_BLOCK]
    # a hot part of one entry point is under 260 bytes (its direct entry's call with it);
    # its cold part, over 100 more
    assert first_block[-1] - first_block[0] < COLD_BLOCK * 260
    assert all(b - a > 100 for a, b in zip(cold[:COLD_BLOCK - 1], cold[1:COLD_BLOCK]))
    assert all(c > first_block[-1] for c in cold), "a cold part among the hot ones"
    assert cold[0] < hot[COLD_BLOCK], "the first block's cold parts come before the next block"
    original = run([plain])
    st = stat([probed], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {p["name"]: p["hits"] for p in st.probes}
    assert hits == {f"work_{i}": i % 5 + 1 for i in range(FUNCTIONS)}


def _calls_through_rdx(code: bytes) -> int:
    import capstone
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    return sum(1 for i in md.disasm(code, 0) if (i.mnemonic, i.op_str) == ("call", "rdx"))


@pytest.mark.parametrize("flags_live", [False, True])
def test_a_loaded_programs_call_lies_with_the_counting_path(flags_live):
    """Where a trampoline calls its probe's direct entry (a program loaded by `run`),
    that call is in its hot part, beside the counting path, and the cold part has none:
    in PostgreSQL, a cold line and page more on each hit of a loaded program cost about
    4% of its CPU a transaction (docs/benchmarks.md). A point of two probes calls no
    entry (its trace path runs both)."""
    from urewrite.arch.x86_64 import trampoline
    refs = trampoline.RuntimeRefs(0x10000, 64, 0x2000, 0x2100, 0x2200, 0x2300, 0x2400)
    hot, cold = trampoline.counting_template(0, refs, flags_live, 1, False, 0, False, (b"",),
                                             False)
    assert (_calls_through_rdx(bytes(hot.code)), _calls_through_rdx(bytes(cold.code))) == (1, 0)
    hot, cold = trampoline.counting_template(0, refs, flags_live, 2, False, 0, False,
                                             (b"", b""), False)
    assert (_calls_through_rdx(bytes(hot.code)), _calls_through_rdx(bytes(cold.code))) == (0, 0)
