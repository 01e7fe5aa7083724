"""x86_64 trampolines laid out hot and cold (rewriter/segment.py, COLD_BLOCK): what a
counting hit runs of a block of trampolines lies together, the rest of theirs after
them. A program of 100 probed functions: the places its sites jump to, the hot parts,
are packed (whole trampolines of this shape take twice the room), every cold part
lies after its block's hot parts, and the program counts every call exactly."""

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
    # a hot part of one entry point is under 200 bytes (a whole trampoline, over 400)
    assert first_block[-1] - first_block[0] < COLD_BLOCK * 200
    assert all(c > first_block[-1] for c in cold), "a cold part among the hot ones"
    assert cold[0] < hot[COLD_BLOCK], "the first block's cold parts come before the next block"
    original = run([plain])
    st = stat([probed], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {p["name"]: p["hits"] for p in st.probes}
    assert hits == {f"work_{i}": i % 5 + 1 for i in range(FUNCTIONS)}
