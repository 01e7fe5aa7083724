"""Jump tables: switches whose indirect jump stays inside the function.

samples/switches.c holds dense switches of several sizes and index types, which
GCC compiles to jump tables, and indirect jumps that are no table (a computed
goto bounded by `&`, a tail call through a pointer). Built with gcc at
-O0/-O2/-O3, PIE and not, with and without -fcf-protection (`notrack jmp`), and
cross-built for arm64 (run under qemu-aarch64), each build is checked so:
- the targets urewrite recovers for each table are exactly the case labels of
  the tables in GCC's own assembly (built with --keep-locals, so that `nm` gives
  every label's address): no table missed where the assembler wrote one, none
  made up where it did not;
- rewritten with every function probed at entry and `-r 'sw_*'`, the program
  prints the same, and every return probe counts what the program says it
  returned; switch functions are no longer refused for their indirect jump,
  and the computed goto and the pointer tail call, whose jumps may stay or
  leave, are patched at those jumps with a check of where each one goes
  (counted only when it leaves);
- an address probe at the instruction right before a case label gets a window
  that does not cover the label (or is refused): before tables were read, the
  label was invisible and the window ran over it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

import cross
from conftest import SAMPLES, check, run, urewrite
from urewrite.arch import backend_for
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import discover
from urewrite.rewriter.planner import Planner

SOURCE = SAMPLES / "switches.c"
# functions whose switch GCC may compile to a table; the rest never is one
SWITCHES = ("sw_small", "sw_medium", "sw_large", "sw_char", "sw_long", "sw_two", "sw_loop")
NOT_TABLES = ("sw_goto", "sw_pointer")  # indirect jumps that may leave
# a lower threshold makes arm64 GCC use tables for the small switches too
THRESHOLD = "--param=case-values-threshold=4"


@dataclass(frozen=True)
class Variant:
    arch: str  # x86_64 or aarch64
    opt: str
    link: str  # pie, no-pie, static
    extra: tuple = ()

    @property
    def id(self) -> str:
        tags = "-".join(re.sub(r"[^a-z0-9]+", "", e) for e in self.extra)
        return f"{self.arch}{self.opt}-{self.link}" + (f"-{tags}" if tags else "")


CET = "-fcf-protection"
NO_CET = "-fcf-protection=none"
X86 = [Variant("x86_64", o, l, (c,)) for o in ("-O0", "-O2", "-O3")
       for l in ("pie", "no-pie") for c in (CET, NO_CET)]
A64 = [Variant("aarch64", o, l) for o in ("-O0", "-O2", "-O3") for l in ("pie", "static")] + \
    [Variant("aarch64", o, "pie", (THRESHOLD,)) for o in ("-O0", "-O2", "-O3")]
VARIANTS = X86 + A64
LINK = {"pie": ["-fPIE", "-pie"], "no-pie": ["-fno-pie", "-no-pie"], "static": ["-static"]}


def _missing(v: Variant) -> Optional[str]:
    absent = cross.missing("gcc") if v.arch == "x86_64" else cross.missing(cross.CC, cross.QEMU,
                                                                           cross.NM)
    return f"needs {', '.join(absent)}" if absent else None


@dataclass
class Build:
    variant: Variant
    path: Path
    tables: Dict[str, Set[frozenset]]  # function -> its tables' case labels, from the assembly
    functions: Dict[str, int]
    prefix: List[str] = field(default_factory=list)  # runs the program (qemu for arm64)

    def command(self, program: Path) -> List[str]:
        return self.prefix + [str(program)]


def _assembly_tables(asm: str, labels: Dict[str, int]) -> Dict[str, Set[frozenset]]:
    """function -> the case-label sets of the tables GCC wrote inside it: runs of
    `.long .LX-.LT`, `.quad .LX`, `.byte (.LX - .Lrtx) / 4`, ... under a .L label."""
    tables: Dict[str, Set[frozenset]] = {}
    function, current = None, None
    entry = re.compile(r"^\s*\.(long|quad|byte|2byte|value|word)\s+\(?(\.L\w+)")
    for line in asm.splitlines():
        m = re.match(r"^\s*\.type\s+([\w.]+),\s*[@%]function", line)
        if m:
            function = m.group(1).split(".")[0]
            continue
        if re.match(r"^\s*\.size\s", line):
            function = None
        m = re.match(r"^(\.L\w+):", line)
        if m:
            current = None
            continue
        m = entry.match(line)
        if m and function:
            if current is None:
                current = []
                tables.setdefault(function, []).append(current)
            current.append(labels[m.group(2)])
        elif not line.strip().startswith(".") or line.strip().startswith((".text", ".section")):
            current = None
    return {f: {frozenset(t) for t in ts} for f, ts in tables.items()}


_builds: Dict[Variant, Build] = {}


def _build(v: Variant, root: Path) -> Build:
    if v in _builds:
        return _builds[v]
    d = root / v.id
    d.mkdir(parents=True, exist_ok=True)
    cc, nm = ("gcc", "nm") if v.arch == "x86_64" else (cross.CC, cross.NM)
    flags = [v.opt, *v.extra, *LINK[v.link]]
    out = d / "switches"
    check([cc, *flags, "-Wa,--keep-locals", "-Wl,--discard-none", str(SOURCE), "-o", str(out)])
    asm = check([cc, *[f for f in flags if f not in ("-pie", "-no-pie", "-static")], "-S",
                 str(SOURCE), "-o", "-"]).stdout
    labels, functions = {}, {}
    for line in check([nm, str(out)]).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            labels.setdefault(parts[2], int(parts[0], 16))
            if parts[1] in "tT":
                functions.setdefault(parts[2], int(parts[0], 16))
    prefix = [] if v.arch == "x86_64" else cross.emulator()
    build = Build(v, out, _assembly_tables(asm, labels), functions, prefix)
    _builds[v] = build
    return build


@pytest.fixture(scope="module", params=VARIANTS, ids=[v.id for v in VARIANTS])
def built(request, tmp_path_factory) -> Build:
    why = _missing(request.param)
    if why:
        pytest.skip(why)
    return _build(request.param, tmp_path_factory.getbasetemp() / "switches")


def _planner(path: Path) -> Planner:
    elf = ElfFile.open(str(path))
    return Planner(elf, backend_for(elf.machine), discover(elf))


def test_recovered_targets_are_the_case_labels(built):
    planner = _planner(built.path)
    recovered: Dict[str, Set[frozenset]] = {}
    indirect: Dict[str, int] = {}
    for fn in planner.functions:
        name = fn.name.split(".")[0]
        tables = planner.model.jump_tables(fn)
        if tables:
            recovered.setdefault(name, set()).update(t.targets for t in tables.values())
        indirect[name] = indirect.get(name, 0) + sum(
            planner.backend.is_indirect_jump(i) for i in planner.model.instructions(fn))
    sample = {f: t for f, t in built.tables.items() if f.startswith("sw_")}
    assert {"sw_medium", "sw_large"} <= set(sample), "GCC wrote no table where expected"
    if built.variant.arch == "x86_64" or THRESHOLD in built.variant.extra:
        assert set(SWITCHES) <= set(sample)
    assert {f: t for f, t in recovered.items() if f.startswith("sw_")} == sample
    for name in NOT_TABLES:  # no table taken for their indirect jumps
        assert name not in recovered
    assert indirect["sw_goto"] >= 1


def _rewrite(build: Build, out: Path, *args: str) -> dict:
    proc = urewrite(str(build.path), *args, "--keep-going", "--json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def test_switch_functions_probed_at_every_return(built, tmp_path):
    probed = tmp_path / "switches.probed"
    _rewrite(built, probed, "-p", "*", "-r", "sw_*")
    listed = {f["name"]: f["return"]
              for f in json.loads(urewrite("list", "--json", str(built.path)).stdout)["functions"]}
    jump = "indirect jump" if built.variant.arch == "x86_64" else "indirect branch"
    for name in SWITCHES + ("sw_call",):
        assert jump not in (listed[name]["reason"] or ""), (name, listed[name])
        if name in built.tables or name == "sw_call":
            assert listed[name]["mechanism"] is not None, (name, listed[name])
    # their jumps are exits too now, checked where they go (a 1-byte `ret` right
    # before a label of the computed goto may still need redirection on x86_64)
    for name in NOT_TABLES:
        assert jump not in (listed[name]["reason"] or ""), (name, listed[name])
        assert listed[name]["mechanism"] == "exit sites" or \
            built.variant.arch == "x86_64" and listed[name]["mechanism"], (name, listed[name])
    if built.variant.arch == "aarch64":  # no redirection there: every table is patched
        assert all(listed[n]["mechanism"] == "exit sites" for n in built.tables if n in SWITCHES)
    original = run(built.command(built.path))
    assert original.returncode == 0, original.stderr
    report = tmp_path / "report.json"
    proc = urewrite("stat", "--json", "-o", str(report), "--", *built.command(probed))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (proc.returncode, proc.stdout) == (0, original.stdout)
    hits = {(p["name"], p["kind"]): p["hits"] for p in json.loads(report.read_text())["probes"]}
    printed = dict((m.group(1), int(m.group(2)))
                   for m in re.finditer(r"^returns (\w+) (\d+)$", original.stdout, re.M))
    assert len(printed) == 10
    for name, count in printed.items():
        assert hits[(name, "entry")] == count, name
        if listed[name]["mechanism"] is not None:
            assert hits[(name, "return")] == count, name
        else:
            assert (name, "return") not in hits


@pytest.mark.parametrize("variant", [v for v in X86 if v.opt != "-O0"], ids=lambda v: v.id)
def test_address_probe_before_a_case_label(variant, tmp_path_factory, tmp_path):
    """A probe at the short instruction that ends where a case label starts: a window
    starting at the probe would run over the label, which only the table names."""
    why = _missing(variant)
    if why:
        pytest.skip(why)
    build = _build(variant, tmp_path_factory.getbasetemp() / "switches")
    planner = _planner(build.path)
    fn = next(f for f in planner.functions if f.name == "sw_large")
    insns = planner.model.instructions(fn)
    starts = {i.end: i for i in insns}
    labels = sorted(next(iter(build.tables["sw_large"])))
    # labels whose previous instruction is shorter than a jump, so a window must reach past it
    chosen = [label for label in labels if label in starts and starts[label].size < 5][:3]
    assert chosen, "no case label follows a short instruction"
    original = run(build.command(build.path))
    data = build.path.read_bytes()
    elf = ElfFile.open(str(build.path))
    for label in chosen:
        site = starts[label].address
        out = tmp_path / f"probed-{site:x}"
        result = _rewrite(build, out, "-p", hex(site))
        if result["refused"]:
            assert not result["probes"]
            continue
        changed = [elf.offset_of(a) for a in range(fn.address, fn.end)]
        patched = out.read_bytes()
        window = [fn.address + k for k, off in enumerate(changed) if patched[off] != data[off]]
        assert window and window[0] <= site < window[-1] + 1
        assert not window[0] < label <= window[-1], \
            f"the window {window[0]:#x}..{window[-1]:#x} covers the case label {label:#x}"
        rerun = run(build.command(out))
        assert (rerun.returncode, rerun.stdout) == (0, original.stdout)
