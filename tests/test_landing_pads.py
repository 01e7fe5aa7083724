"""C++ landing pads: read from each FDE's LSDA, and never covered by a patch window.

The reader is checked against GCC's own assembly: the call-site tables GCC writes
name each landing pad by a label; a symbol put at each of those labels gives, after
linking, the addresses the reader must find (x86_64 PIE, non-PIE and shared, arm64).

End to end, samples/landing_pads.cc (a catch, a cleanup and an exception freed on
the way, at -O0/-O2/-O3, PIE and non-PIE) is rewritten with an address probe at every
instruction of its throwing and catching functions, each window on its own, and run:
the output must be the original's, and the hits those of kernel uprobes where they can
be used. At -O0 a landing pad follows a 2-byte `jmp`, at -O2 and -O3 a `ret`: a window
starting there covered the pad, and the unwinder resumed inside the jump.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

import cross
from conftest import SAMPLES, Uprobes, check, rewrite, run, stat, uprobes_unavailable, urewrite
from urewrite.rewriter import eh_frame, except_table
from urewrite.rewriter.debug_sections import uleb128
from urewrite.rewriter.eh_frame import ValueReader
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.pipeline import analyse
from urewrite.rewriter.plan.results import Refusal
from urewrite.rewriter.selectors import select

SAMPLE = SAMPLES / "landing_pads.cc"
FUNCTIONS = ("_Z5checki", "_Z7guardedi", "_Z7catcheri")  # and their .cold parts
LINKS = {"pie": ["-fPIE", "-pie"], "no-pie": ["-fno-pie", "-no-pie"],
         "shared": ["-fPIC", "-shared"]}
READER_VARIANTS = [("g++", opt, link) for opt in ("-O0", "-O2", "-O3") for link in LINKS] + \
                  [(cross.CXX, opt, "pie") for opt in ("-O0", "-O2")]


# -- the reference: GCC's call-site tables, labelled ------------------------------------

def _pad_labels(asm: str) -> list:
    """The landing-pad labels of every call-site table in GCC's assembly: each record
    is four .uleb128 fields (start, length, landing pad, action)."""
    pads, fields = [], None
    for line in asm.splitlines():
        text = line.strip()
        if re.fullmatch(r"\.LLSDACSBC?\d+:", text):
            fields = []
        elif re.fullmatch(r"\.LLSDACSEC?\d+:", text):
            assert len(fields) % 4 == 0, fields
            pads += [f.split("-")[0] for f in fields[2::4] if f != "0"]
            fields = None
        elif fields is not None:
            m = re.fullmatch(r"\.uleb128\s+(\S+)", text)
            assert m, f"a call-site field this test does not know: {text!r}"
            fields.append(m[1])
    return pads


def build_labelled(compiler: str, flags: list, out: Path) -> dict:
    """Build the sample from its assembly with a symbol at each landing pad; the
    symbols' addresses after linking: the landing pads the reader must find."""
    asm = out.with_suffix(".s")
    check([compiler, *flags, "-S", SAMPLE, "-o", asm])
    text = asm.read_text()
    labels = sorted(set(_pad_labels(text)))
    assert labels, "GCC wrote no landing pad"
    for k, label in enumerate(labels):
        text, n = re.subn(rf"^{re.escape(label)}:$", f"{label}:\n__lp_{k}:", text, flags=re.M)
        assert n == 1, label
    asm.write_text(text)
    check([compiler, *flags, asm, "-o", out])
    symbols = check(["nm", out]).stdout
    return {int(m[1], 16) for m in re.finditer(r"^([0-9a-f]+) \w __lp_\d+$", symbols, re.M)}


@pytest.mark.parametrize("compiler,opt,link", READER_VARIANTS,
                         ids=[f"{c.split('-')[0]}{o}-{l}" for c, o, l in READER_VARIANTS])
def test_landing_pads_are_those_gcc_labels(compiler, opt, link, tmp_path):
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    expected = build_labelled(compiler, [opt, *LINKS[link]], tmp_path / "sample")
    found = except_table.landing_pads(ElfFile.open(str(tmp_path / "sample")))
    assert found.unreadable == []
    assert found.pads == sorted(expected)
    assert len(expected) >= 4


def test_system_libstdcxx_landing_pads_lie_in_their_functions():
    path = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    if not path.exists():
        pytest.skip(f"no {path}")
    elf = ElfFile.open(str(path))
    found = except_table.landing_pads(elf)
    assert found.unreadable == [] and len(found.pads) > 1000
    checked = 0
    for start, size, lsda in eh_frame.fde_lsdas(elf):
        if lsda:
            pads = except_table.lsda_landing_pads(elf, {}, lsda, start)
            assert all(start <= pad < start + size for pad in pads), hex(start)
            checked += len(pads)
    assert checked >= len(found.pads)


# -- encodings GCC does not write: hand-made LSDAs -----------------------------------------

def _entry(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _cie(augmentation: bytes, data: bytes) -> bytes:
    return _entry(struct.pack("<IB", 0, 1) + augmentation + b"\0" + b"\x01\x78\x10"
                  + bytes([len(data)]) + data)


def _fde(at: int, cie_at: int, start: int, size: int, lsda: bytes) -> bytes:
    return _entry(struct.pack("<Iii", at + 4 - cie_at, start, size) + bytes([len(lsda)]) + lsda)


def test_fde_lsda_pointers():
    """zPLR (GCC's order) with a pc-relative LSDA pointer, a zero pointer (no LSDA, as
    libgcc reads it), and zRL with an absolute one."""
    cie = _cie(b"zPLR", b"\x9b" + struct.pack("<i", 0x40) + b"\x1b\x1b")
    first = _fde(len(cie), 0, 0x100, 8, struct.pack("<i", 0x2000))
    second = _fde(len(cie) + len(first), 0, 0x200, 8, struct.pack("<i", 0))
    at = len(cie) + len(first) + len(second)
    other = _cie(b"zRL", b"\x1b\x03")
    third = _fde(at + len(other), at, 0x300, 8, struct.pack("<I", 0x9000))
    base = 0x4000
    walker = eh_frame._Walker(cie + first + second + other + third, base, lsdas=True)
    fdes = walker.fdes()
    assert [size for _, size in fdes] == [8, 8, 8]
    lsda_field = base + len(cie) + 4 + 12 + 1  # length, CIE pointer, start and size, aug length
    assert walker.lsdas == [(fdes[0][0], 8, lsda_field + 0x2000), (fdes[1][0], 8, 0),
                            (fdes[2][0], 8, 0x9000)]
    assert eh_frame._Walker(cie + first, base).fdes() == fdes[:1]  # the same without lsdas


def test_lsda_with_lpstart_ttype_and_udata4_call_sites():
    # LPStart pcrel|sdata4 (-0x40 from its own field), TType udata4 + offset, call sites udata4
    sites = struct.pack("<IIIB", 0x10, 5, 0x20, 0) + struct.pack("<IIIB", 0x30, 5, 0, 0) \
        + struct.pack("<IIIB", 0x40, 2, 0x48, 1)
    lsda = b"\x1b" + struct.pack("<i", -0x40) + b"\x03" + uleb128(200) + b"\x03" \
        + uleb128(len(sites)) + sites
    base = 0x5000
    pads = except_table.read_lsda(ValueReader(lsda, base), 0, len(lsda), 0x1234)
    assert pads == [base + 1 - 0x40 + 0x20, base + 1 - 0x40 + 0x48]


def test_lsda_defaults_lpstart_to_the_function_and_reads_uleb_sites():
    sites = uleb128(0) + uleb128(300) + uleb128(0x105) + uleb128(0) + uleb128(300) \
        + uleb128(4) + b"\0\0"
    lsda = b"\xff\xff\x01" + uleb128(len(sites)) + sites
    assert except_table.read_lsda(ValueReader(lsda, 0), 0, len(lsda), 0x401000) == [0x401105]


def test_lsda_unknown_call_site_encoding_and_truncation_are_reported():
    with pytest.raises(eh_frame.UnsupportedEncoding):
        except_table.read_lsda(ValueReader(b"\xff\xff\x31\x00", 0), 0, 4, 0)  # datarel
    with pytest.raises(eh_frame.Truncated):
        except_table.read_lsda(ValueReader(b"\xff\xff\x01\x10\x00", 0), 0, 5, 0)


# -- the planner ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def o2_sample(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    path = tmp_path_factory.mktemp("lp") / "landing_pads"
    check(["g++", "-O2", SAMPLE, "-o", path])
    return path


def _ret_before_pad(path) -> tuple:
    """(address of the `ret` just before a landing pad, the pad), in guarded()."""
    pads = except_table.landing_pads(ElfFile.open(str(path))).pads
    insns = _instructions(path, {"_Z7guardedi"})
    for (address, size), (after, _) in zip(insns, insns[1:]):
        if size == 1 and after in pads:
            return address, after
    raise AssertionError("gcc -O2 no longer puts a landing pad right after guarded()'s ret")


def test_a_window_never_covers_a_landing_pad(o2_sample, tmp_path, monkeypatch):
    site, pad = _ret_before_pad(o2_sample)
    a = analyse(str(o2_sample))
    [plan] = a.planner.plan(select([hex(site)], a.functions, a.planner.model.boundaries, []))
    assert not isinstance(plan, Refusal), plan.reason
    assert plan.window.end <= pad  # the window starts earlier, and stops at the pad
    unknown = except_table.LandingPads([], [(pad - 8, pad + 8, "the function at X, whose...")])
    monkeypatch.setattr(except_table, "landing_pads", lambda elf: unknown)
    a = analyse(str(o2_sample))
    [refusal] = a.planner.plan(select([hex(site)], a.functions, a.planner.model.boundaries, []))
    assert isinstance(refusal, Refusal), refusal.window
    assert "a C++ landing pad may lie anywhere in the function at X, whose..." in refusal.reason


# -- end to end ---------------------------------------------------------------------------

def _sizes(path) -> dict:
    """FUNC symbols of the sample's throwing functions and their .cold parts: name -> (address, size)."""
    out = {}
    for line in check(["readelf", "-sW", path]).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC" and parts[7].split(".cold")[0] in FUNCTIONS:
            out[parts[7]] = (int(parts[1], 16), int(parts[2], 0))
    return out


def _instructions(path, names=None) -> list:
    """(address, size) of every instruction of those functions, as objdump decodes them."""
    ranges = [r for n, r in _sizes(path).items() if names is None or n in names]
    lines = check(["objdump", "-d", "-w", path]).stdout.splitlines()
    out = []
    for line in lines:
        m = re.match(r"\s+([0-9a-f]+):\t((?:[0-9a-f]{2} )+)", line)
        if m:
            address = int(m[1], 16)
            if any(lo <= address < lo + size for lo, size in ranges):
                out.append((address, len(m[2].split())))
    return out


def _batches(addresses: list, spacing: int = 48) -> list:
    """Sites far enough apart that no two windows can meet (a window starts at most 24
    bytes before its site and ends within 20 after): each is planned as if alone."""
    batches = []
    for address in sorted(addresses):
        batch = next((b for b in batches if address - b[-1] >= spacing), None)
        if batch is None:
            batches.append([address])
        else:
            batch.append(address)
    return batches


VARIANTS = [(opt, link) for opt in ("-O0", "-O2", "-O3") for link in ("pie", "no-pie")] \
    + [("-O2 -fcf-protection=full", "pie")]  # landing pads start with endbr64, as libstdc++'s


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("opt,link", VARIANTS,
                         ids=[f"{o[1:].replace(' -', '-')}-{l}" for o, l in VARIANTS])
def test_every_instruction_probed_around_landing_pads(opt, link, tmp_path):
    plain = tmp_path / "landing_pads"
    check(["g++", *opt.split(), *LINKS[link], SAMPLE, "-o", plain])
    original = run([plain])
    assert original.returncode == 0 and "caught small 29" in original.stdout, original
    insns = _instructions(plain)
    pads = except_table.landing_pads(ElfFile.open(str(plain))).pads
    before_pad = {a for (a, size), (after, _) in zip(insns, insns[1:])
                  if after in pads and size < 5}
    assert before_pad, "no landing pad follows a short instruction: nothing is tested"
    hits, refused = {}, {}

    def probe(k: int, batch: list) -> None:  # (in threads: each waits for its processes)
        probed = tmp_path / f"probed-{k}"
        result = rewrite(plain, probed, *map(hex, batch), extra=["--keep-going"])
        refused.update({r["address"]: r["reason"] for r in result["refused"]})
        report = stat([probed], tmp_path)
        assert (report.proc.returncode, report.proc.stdout) == (0, original.stdout), \
            (batch, report.proc.stderr)
        hits.update({a: n for a, n in report.by_address().items() if a in batch})

    # the oracle, how often each instruction really runs, meanwhile: the kernel takes
    # 60 ms to take each uprobe down again, 10 s for these (it waits, the cores work on)
    oracle = (lambda: Uprobes().count(plain, {hex(a): a for a, _ in insns},
                                      lambda: run([plain]))) \
        if uprobes_unavailable() is None else dict
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2) + 1) \
            as pool:
        counted = pool.submit(oracle)
        for done in [pool.submit(probe, k, batch)
                     for k, batch in enumerate(_batches([a for a, _ in insns]))]:
            done.result()  # (raises what the batch raised)
        counted = counted.result()
    assert set(hits) | set(refused) == {a for a, _ in insns}
    assert before_pad - set(refused), "every site next to a landing pad was refused"
    assert len(refused) < len(insns) / 3, refused
    if counted:
        assert {a: counted[hex(a)] for a in hits} == hits


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-O3"])
def test_return_probes_next_to_landing_pads(opt, tmp_path):
    """At -O2 a landing pad follows the `ret` of guarded() and of catcher(): the exit
    window must start before the `ret`, not run over the pad."""
    plain, probed = tmp_path / "landing_pads", tmp_path / "probed"
    check(["g++", opt, SAMPLE, "-o", plain])
    original = run([plain])
    args = [a for name in FUNCTIONS for a in ("-r", name, "-p", name)]
    out = urewrite(plain, *args, "--keep-going", "--json", "-o", probed)
    assert out.returncode == 0, out.stderr
    refused = {r["name"] for r in json.loads(out.stdout)["refused"]}
    if opt != "-O0":
        assert refused == set()
    report = stat([probed], tmp_path)
    assert (report.proc.returncode, report.proc.stdout) == (0, original.stdout)
    returned = int(re.search(r"^returned (\d+)$", original.stdout, re.M)[1])
    expected = {"_Z5checki": returned, "_Z7guardedi": returned, "_Z7catcheri": 200}
    for name in FUNCTIONS:
        assert report.hits(name) >= 200  # the entry, and the return where it is patched
        if name not in refused:
            got = [p["hits"] for p in report.probes if p["name"] == name and p["kind"] == "return"]
            assert got == [expected[name]], name
