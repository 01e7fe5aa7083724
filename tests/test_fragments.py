"""Parts of a function split off by the compiler (.cold parts): with symbols they are
named f.cold; stripped, they look like functions of their own (fn_<address>). Their
.eh_frame entries start inside the parent's frame, which is how they are told apart:
a return probe on the parent follows them, and none may redirect a return address
there (what is on top of the stack is not one)."""

import json
import shutil
import subprocess
import sys

import pytest

from urewrite.rewriter import eh_frame
from urewrite.rewriter.elf_file import ElfFile

from conftest import SAMPLES, run

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def urewrite(*args):
    return run([sys.executable, "-m", "urewrite", *args])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("fragments")
    plain, stripped = work / "fragments", work / "fragments.stripped"
    subprocess.run(["gcc", "-O2", str(SAMPLES / "fragments.c"), "-o", plain], check=True)
    subprocess.run(["strip", "-o", stripped, plain], check=True)
    symbols = subprocess.run(["nm", plain], capture_output=True, text=True).stdout
    address = {line.split()[2]: int(line.split()[0], 16) for line in symbols.splitlines()
               if len(line.split()) == 3}
    f, cold = address["f"], address["f.cold"]
    frames = eh_frame.entry_frames(ElfFile.open(str(plain)))
    # what makes the test mean something: the part starts inside f's frame
    assert frames[cold].cfa_offset > 8 and frames[f].cfa_offset == 8
    return work, plain, stripped, f, cold


def returns_listed(path):
    listed = json.loads(urewrite("list", "--json", path).stdout)["functions"]
    return {f["address"]: f["return"] for f in listed}


@pytest.mark.parametrize("which", ["plain", "stripped"])
def test_a_return_probe_follows_the_split_off_part(built, which):
    work, plain, stripped, f, cold = built
    binary = plain if which == "plain" else stripped
    name = "f" if which == "plain" else f"fn_{f:x}"
    listed = returns_listed(binary)
    assert listed[f]["mechanism"] == "exit sites"  # not a jump to the part taken as a return
    assert listed[cold]["mechanism"] is None
    assert "a part of another function" in listed[cold]["reason"]
    assert "no return address on top" in listed[cold]["reason"]

    probed = work / f"{which}.probed"
    out = urewrite(binary, "-p", name, "-r", name, "-o", probed)
    assert out.returncode == 0, out.stderr
    original = subprocess.run([binary], capture_output=True, text=True)
    out = urewrite("stat", "--json", "--", probed)
    start = out.stdout.index('{\n  "exit_code"')
    assert out.stdout[:start] == original.stdout
    hits = {p["kind"]: p["hits"] for p in json.loads(out.stdout[start:])["probes"]}
    assert hits == {"entry": 100, "return": 100}
    assert original.stderr.count("odd") > 0  # some calls took the split-off path


def test_the_part_itself_takes_no_return_probe(built):
    work, _, stripped, _, cold = built
    out = urewrite(stripped, "-r", f"fn_{cold:x}", "-o", work / "cold.probed")
    assert out.returncode == 1
    assert "a part of another function" in out.stderr
    assert not (work / "cold.probed").exists()
