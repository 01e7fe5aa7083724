"""What a rewrite leaves of the file: the original's symbols, notes, sections and bytes.

Checked on the -O2 builds of the matrix (PIE, no-PIE, static, shared library;
CET on and off) with binutils as the independent reader.
"""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from conftest import check, run, urewrite, without_new_code
from variants import LINKS, CETS, make_subject, variant_id

LAYOUT_VARIANTS = [("-O2", link, cet) for link in LINKS for cet in CETS]


@pytest.fixture(params=LAYOUT_VARIANTS, ids=[variant_id(*v) for v in LAYOUT_VARIANTS])
def subject(request, builder):
    return make_subject(builder, *request.param)


def tool(*cmd):
    return check(list(cmd)).stdout


def test_symbols_are_unchanged(subject):
    """The input's symbols all stay, and the only ones added name the new code."""
    probed, original = tool("nm", subject.probed), tool("nm", subject.original)
    assert without_new_code(probed) == without_new_code(original) and probed != original
    assert re.search(r"^[0-9a-f]+ t urewrite\.slow_hit$", probed, re.M)
    assert tool("nm", "-D", subject.probed) == tool("nm", "-D", subject.original)
    probed, original = tool("readelf", "-sW", subject.probed), tool("readelf", "-sW",
                                                                     subject.original)
    assert without_new_code(probed) == without_new_code(original)
    dynamic = lambda text: text.split("Symbol table '.symtab'")[0]  # noqa: E731
    assert dynamic(probed) == dynamic(original)


def test_notes_are_unchanged(subject):
    notes = tool("readelf", "-n", subject.original)
    assert "Build ID" in notes
    assert tool("readelf", "-n", subject.probed) == notes


def test_readelf_has_no_warnings(subject):
    proc = run(["readelf", "-aW", subject.probed])
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert "Warning" not in proc.stdout


def test_objdump_disassembles(subject):
    proc = run(["objdump", "-d", subject.probed])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "<main>:" in proc.stdout or "<demo_fib>:" in proc.stdout


def _sections(path):
    """name -> (type, address, size) of each section, from readelf -SW."""
    out = {}
    for line in tool("readelf", "-SW", path).splitlines():
        m = re.match(r"\s*\[\s*(\d+)\]\s+(\S*)\s+(\S+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1) != "0":
            out[m.group(2)] = (int(m.group(1)), m.group(3), int(m.group(4), 16), int(m.group(6), 16))
    return out


def test_original_sections_keep_their_place(subject):
    before = _sections(subject.original)
    after = _sections(subject.probed)
    for name, (index, type_, address, size) in before.items():
        if name in (".shstrtab", ".symtab", ".strtab"):  # re-emitted with new names added
            assert after[name][:3] == (index, type_, address) and after[name][3] > size
            continue
        assert after[name] == (index, type_, address, size), name
    new = set(after) - set(before)
    assert new == {".urewrite.rodata", ".urewrite.text", ".urewrite.state", ".urewrite.live",
                   ".debug_frame"}  # (rows for the moved instructions: debug_sections)
    # the live tracer's descriptor is not loaded: no address, and readelf takes it
    assert after[".urewrite.live"][1:3] == ("PROGBITS", 0)


def test_dynamic_section(subject):
    """Unchanged, except DT_INIT, which may now start the probe runtime first."""
    before = tool("readelf", "-dW", subject.original).splitlines()
    after = tool("readelf", "-dW", subject.probed).splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert all("(INIT)" in a and "(INIT)" in b for a, b in changed), changed
    if subject.link == "shared":
        assert len(changed) == 1  # the only way in for a library


def test_the_input_is_left_alone(subject, tmp_path):
    data = subject.original.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    mtime = os.stat(subject.original).st_mtime_ns
    out = tmp_path / subject.probed.name  # the name goes into the file
    proc = urewrite(str(subject.original), "-p", "*", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
    assert hashlib.sha256(subject.original.read_bytes()).hexdigest() == digest
    assert os.stat(subject.original).st_mtime_ns == mtime
    # same mode; the original bytes outside the patched windows are kept
    assert os.stat(out).st_mode == os.stat(subject.original).st_mode
    rewritten = out.read_bytes()
    assert len(rewritten) > len(data)
    assert rewritten == subject.probed.read_bytes()  # a rewrite is reproducible
    differing = sum(1 for a, b in zip(data, rewritten) if a != b)
    assert differing <= sum(p["displaced"] for p in subject.result["probes"]) + 64 + 16
    assert os.listdir(tmp_path) == [out.name]  # no temporary file left behind
