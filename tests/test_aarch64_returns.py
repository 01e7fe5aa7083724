"""Return probes on arm64, under qemu-aarch64: the semantics tests/test_returns.py checks on x86_64.

The arm64 backend patches each exit of a function (`ret`, `retaa`/`retab`, a
tail-call `b`) in place with one `B`. samples/returns.c (recursion 10,000 deep,
four threads, longjmp out of a probed frame, a signal handler re-entering the
probed function, tail calls), samples/returns_cxx.cc (a C++ exception thrown
through probed frames) and samples/noreturn.c are cross-compiled at
-O0/-O2/-O3, as PIE, static, or a shared library loaded by a program; without
pointer authentication, with -mbranch-protection=standard (`paciasp` ...
`autiasp; ret`), with it for armv8.3-a (`retaa`) and with the B key (`retab`). Each build is rewritten
once, then every case
- runs with the same output and exit status as the original, disarmed and under
  `urewrite stat --json` (through the emulator);
- counts exactly the returns (and entries) the sample makes, which the test
  knows independently of the program and the program also prints;
and the rewrite changes only the site words, into `B`s: no `paciasp`,
`autiasp` or `bti` moves, so signed return addresses stay as they were.
Return values and latency are not checked here (x86_64 only so far).

Everything is built once per module, in parallel, into a temporary directory.
"""

from __future__ import annotations

import json
import re
import struct
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from conftest import check, run, urewrite
from cross import (BP, CC, CXX, LIB_INIT, LIB_INIT_C, QEMU, Run, emulate, exit_status, needs,
                   prepare_all, require_sysroot)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
PAC_FLAGS = {"": [], "bp": [BP], "bp83": [BP, "-march=armv8.3-a"],
             "bkey": ["-mbranch-protection=pac-ret+b-key", "-march=armv8.3-a"]}

pytestmark = needs(CC, CXX, QEMU)


# -- what the samples do ------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    source: str
    entries: Tuple[str, ...]  # probed at entry (-p)
    returns: Tuple[str, ...]  # probed at every return (-r)
    cases: Dict[Tuple[str, ...], Dict[Tuple[str, str], int]]  # argv -> (name, kind) -> hits
    printed: Dict[str, str]  # the program's "returns NAME N" lines: NAME -> probe name
    exit_codes: Dict[Tuple[str, ...], int] = field(default_factory=dict)  # argv -> status
    no_exit: Tuple[str, ...] = ()  # return-probed functions with no exit to patch


MIDDLE, THROWER = "_Z6middlei", "_Z7throweri"
SAMPLE = {
    "returns": Sample(
        "returns.c", ("depth", "work", "maybe_jump"),
        ("depth", "work", "maybe_jump", "nested", "tail", "callee"),
        {("recursion",): {("depth", "entry"): 10001, ("depth", "return"): 10001},
         ("threads",): {("work", "entry"): 1_000_000, ("work", "return"): 1_000_000},
         # a quarter of the calls leave by longjmp: entered, never returned
         ("longjmp",): {("maybe_jump", "entry"): 100, ("maybe_jump", "return"): 75},
         # 50 calls, each interrupted by a handler that calls it again
         ("signal",): {("nested", "return"): 100},
         # 29 of the 50 calls end in a tail call to callee: callee returns for them
         ("tail",): {("tail", "return"): 50, ("callee", "return"): 29}},
        {name: name for name in ("depth", "work", "maybe_jump", "nested", "tail", "callee")}),
    "cxx": Sample(
        "returns_cxx.cc", (MIDDLE, THROWER), (MIDDLE, THROWER),
        # 20 of 100 throws pass through middle: neither returns for them
        {(): {(MIDDLE, "entry"): 100, (MIDDLE, "return"): 80,
              (THROWER, "entry"): 100, (THROWER, "return"): 80}},
        {"middle": MIDDLE, "thrower": THROWER}),
    "noreturn": Sample(
        "noreturn.c", ("die",), ("die",),
        {(): {}, ("x",): {("die", "entry"): 1}}, {}, {("x",): 4}, no_exit=("die",)),
}

OPTS = ["-O0", "-O2", "-O3"]
LINK_FLAGS = {"pie": ["-fPIE", "-pie"], "static": ["-static"], "shared": ["-fPIC"]}


@dataclass(frozen=True)
class Variant:
    sample: str  # returns, cxx, noreturn
    opt: str
    link: str  # pie, static, shared (the sample as a library, main renamed, and a driver)
    pac: str  # a key of PAC_FLAGS

    @property
    def id(self) -> str:
        return f"{self.sample}{self.opt}-{self.link}" + (f"-{self.pac}" if self.pac else "")


def _variants() -> List[Variant]:
    out = [Variant("returns", opt, link, pac)
           for opt in OPTS for link in ("pie", "static", "shared") for pac in ("", "bp")]
    out += [Variant("returns", "-O2", link, "bp83") for link in ("pie", "static", "shared")]
    out += [Variant("returns", "-O3", "pie", "bkey"), Variant("cxx", "-O2", "pie", "bkey")]
    out += [Variant("cxx", opt, "pie", pac) for opt in OPTS for pac in ("", "bp")]
    out += [Variant("cxx", "-O2", "static", "bp"), Variant("cxx", "-O2", "shared", "bp"),
            Variant("cxx", "-O2", "pie", "bp83")]
    out += [Variant("noreturn", opt, "pie", "") for opt in OPTS]
    out += [Variant("noreturn", "-O2", "static", "bp"), Variant("noreturn", "-O3", "pie", "bp83")]
    return out


VARIANTS = _variants()
CASES = [(v.id, args) for v in VARIANTS for args in SAMPLE[v.sample].cases]


# -- building, rewriting, running one variant ----------------------------------------------

@dataclass
class Prepared:
    variant: Variant
    dir: Path
    target: Optional[Path] = None  # the file rewritten
    rewritten: Optional[Path] = None
    program: Optional[Path] = None  # what runs: the target, or a driver loading it
    result: Optional[dict] = None  # urewrite --json
    original: Dict[Tuple[str, ...], Run] = field(default_factory=dict)
    disarmed: Dict[Tuple[str, ...], Run] = field(default_factory=dict)
    armed: Dict[Tuple[str, ...], Run] = field(default_factory=dict)
    error: Optional[str] = None

    def ok(self) -> "Prepared":
        if self.error:
            pytest.fail(f"preparing {self.variant.id} failed:\n{self.error}", pytrace=False)
        return self


# runs a sample built as a library, its main renamed (a C++ name is mangled: the driver is C++)
DRIVER = {".c": "int sample_main(int, char **);\n"
                "int main(int argc, char **argv) { return sample_main(argc, argv); }\n",
          ".cc": "int sample_main();\nint main() { return sample_main(); }\n"}


def _build(p: Prepared) -> None:
    v, d, sample = p.variant, p.dir, SAMPLE[p.variant.sample]
    compiler = CXX if sample.source.endswith(".cc") else CC
    flags = [v.opt, *PAC_FLAGS[v.pac]] + (["-pthread"] if v.sample == "returns" else [])
    src = SAMPLES / sample.source
    if v.link != "shared":
        p.target = p.program = d / v.sample
        check([compiler, *flags, *LINK_FLAGS[v.link], src, "-o", p.target])
        return
    lib_flags = [*flags, "-fPIC", "-shared", f"-Wl,-soname,lib{v.sample}.so"]
    extra: List[Path] = []
    if v.pac:  # no start files: the library keeps its BTI/PAC property note
        (d / "init.c").write_text(LIB_INIT_C)
        lib_flags += ["-nostartfiles", f"-Wl,-init,{LIB_INIT}"]
        extra = [d / "init.o"]
        check([CC, *flags, "-fPIC", "-c", d / "init.c", "-o", extra[0]])
    p.target = d / f"lib{v.sample}.so"
    check([compiler, *lib_flags, "-Dmain=sample_main", src, *extra, "-o", p.target])
    driver = d / f"driver{src.suffix}"
    driver.write_text(DRIVER[src.suffix])
    p.program = d / "driver"
    check([compiler, *flags, driver, f"-L{d}", f"-l{v.sample}", "-o", p.program])


def _command(p: Prepared, rewritten: bool, args) -> List[str]:
    folder = p.rewritten.parent if rewritten else p.dir
    libdir = folder if p.variant.link == "shared" else None
    program = folder / p.program.name if p.program == p.target else p.program
    return emulate(program, libdir) + list(args)


def _outcome(proc) -> Run:
    return Run(exit_status(proc.returncode), proc.stdout, proc.stderr)


def _stat(p: Prepared, args) -> Run:
    report = p.dir / f"report-{'-'.join(args) or 'none'}.json"
    proc = urewrite("stat", "--json", "-o", str(report), "--", *_command(p, True, args))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert report.exists(), f"stat wrote no report (exit {proc.returncode}):\n{proc.stderr}"
    out = _outcome(proc)
    out.report = json.loads(report.read_text())
    return out


def _prepare(v: Variant, root: Path) -> Prepared:
    p = Prepared(v, root / v.id)
    sample = SAMPLE[v.sample]
    try:
        p.dir.mkdir(parents=True)
        _build(p)
        (p.dir / "probed").mkdir()
        p.rewritten = p.dir / "probed" / p.target.name
        specs = [a for name in sample.returns for a in ("-r", name)]
        specs += [a for name in sample.entries for a in ("-p", name)]
        proc = urewrite(str(p.target), *specs, "-o", str(p.rewritten), "--json")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
            f"urewrite {' '.join(specs)} failed ({proc.returncode}):\n{proc.stderr}"
        p.result = json.loads(proc.stdout)
        for args in sample.cases:
            p.original[args] = _outcome(run(_command(p, False, args)))
            p.disarmed[args] = _outcome(run(_command(p, True, args)))
            p.armed[args] = _stat(p, args)
    except Exception:  # reported by each test of the variant
        p.error = traceback.format_exc()
    return p


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Dict[str, Prepared]:
    return prepare_all(tmp_path_factory, "aarch64-returns", VARIANTS, _prepare)


# -- reading the results ------------------------------------------------------------------

def _hits(report: dict, obj: str) -> Dict[Tuple[str, str], int]:
    out: Dict[Tuple[str, str], int] = {}
    for probe in report["probes"]:
        if probe["object"] == obj:
            key = (probe["name"], probe["kind"])
            out[key] = out.get(key, 0) + probe["hits"]
    return out


def _printed_returns(stdout: str, sample: Sample) -> Dict[Tuple[str, str], int]:
    return {(sample.printed[m.group(1)], "return"): int(m.group(2))
            for m in re.finditer(r"^returns (\w+) (\d+)$", stdout, re.M)}


def _text(path: Path) -> Tuple[int, bytes]:
    """(address, bytes) of the file's .text section, read from its section headers."""
    data = path.read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for name, _, _, addr, offset, size, *_ in headers:
        if data[names + name:data.index(b"\0", names + name)] == b".text":
            return addr, data[offset:offset + size]
    raise AssertionError(f"{path}: no .text")


# paciasp, pacibsp, autiasp, autibsp, bti c/j/jc: what signs, checks or lands
_PAC_AND_BTI = {0xD503233F, 0xD503237F, 0xD50323BF, 0xD50323FF, 0xD503245F, 0xD503249F,
                0xD50324DF}


def _is_b(word: int) -> bool:
    return word & 0xFC000000 == 0x14000000


# -- the tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("vid", [v.id for v in VARIANTS])
def test_every_exit_is_patched(prepared, vid):
    p = prepared[vid].ok()
    sample = SAMPLE[p.variant.sample]
    assert p.result["refused"] == []
    placed = {(probe["name"], probe["kind"]) for probe in p.result["probes"]}
    wanted = {(name, "entry") for name in sample.entries}
    wanted |= {(name, "return") for name in sample.returns if name not in sample.no_exit}
    assert placed == wanted


@pytest.mark.parametrize("vid,args", CASES, ids=[f"{vid}-{'-'.join(a) or 'none'}" for vid, a in CASES])
def test_runs_like_the_original_and_counts_exactly(prepared, vid, args):
    p = prepared[vid].ok()
    sample = SAMPLE[p.variant.sample]
    original, disarmed, armed = p.original[args], p.disarmed[args], p.armed[args]
    assert original.returncode == sample.exit_codes.get(args, 0), \
        f"the original does not run as its sample says:\n{original.stdout}\n{original.stderr}"
    assert (disarmed.returncode, disarmed.stdout) == (original.returncode, original.stdout), \
        f"disarmed:\n{disarmed.stderr}"
    assert (armed.returncode, armed.stdout) == (original.returncode, original.stdout), \
        f"under urewrite stat:\n{armed.stderr}"
    assert armed.report["exit_code"] == original.returncode
    assert armed.report["processes"] == 1
    expected = {(name, "entry"): 0 for name in sample.entries}
    expected.update({(name, "return"): 0 for name in sample.returns})
    expected.update(sample.cases[args])
    assert _hits(armed.report, p.target.name) == expected
    # the program's own count of returns agrees with the test's
    printed = _printed_returns(original.stdout, sample)
    assert bool(printed) == bool(sample.printed), original.stdout
    assert {key: expected[key] for key in printed} == printed


@pytest.mark.parametrize("vid", [v.id for v in VARIANTS])
def test_only_the_sites_change_and_pointer_authentication_stays(prepared, vid):
    p = prepared[vid].ok()
    base, before = _text(p.target)
    base_after, after = _text(p.rewritten)
    assert (base_after, len(after)) == (base, len(before))
    changed = {}
    for at in range(0, len(before), 4):
        old, new = (int.from_bytes(code[at:at + 4], "little") for code in (before, after))
        if old != new:
            changed[base + at] = (old, new)
    sites = {probe["address"] for probe in p.result["probes"]}
    assert changed, "no site patched"
    for address, (old, new) in changed.items():
        assert _is_b(new), f"{address:#x}: {new:#010x} is not a b"
        assert old not in _PAC_AND_BTI, f"{address:#x}: {old:#010x} was overwritten"
        # an entry site after its function's landing pad (bti c / paciasp) starts 4 later
        assert address in sites or address - 4 in sites, f"{address:#x} is not a site"
    if p.variant.pac:
        signs = sum(1 for at in range(0, len(before), 4)
                    if int.from_bytes(before[at:at + 4], "little") in _PAC_AND_BTI)
        assert signs > 0, "built with -mbranch-protection, yet no paciasp/bti in .text"


PAC_C = r"""
/* a signed return address changed before autiasp: with pointer authentication
 * the return faults; without it, it lands 4 bytes late and skips "mov w0, #9" */
__asm__(".text\n"
        ".globl check_pac\n .type check_pac, %function\n"
        "check_pac:\n stp x29, x30, [sp, #-16]!\n mov w0, #7\n bl signed_ret\n"
        " mov w0, #9\n ldp x29, x30, [sp], #16\n ret\n .size check_pac, .-check_pac\n"
        ".type signed_ret, %function\n"
        "signed_ret:\n paciasp\n add x30, x30, #4\n autiasp\n ret\n"
        " .size signed_ret, .-signed_ret\n");
int check_pac(void);
int main(void) { return check_pac(); }
"""


def test_pointer_authentication_is_enforced_under_qemu(tmp_path):
    """The -bp variants check something only if qemu faults on a badly signed return."""
    require_sysroot()
    (tmp_path / "pac.c").write_text(PAC_C)
    check([CC, "-O2", tmp_path / "pac.c", "-o", tmp_path / "pac"])
    proc = run(emulate(tmp_path / "pac"))
    assert proc.returncode < 0, \
        f"a return through a badly signed address should fault, got exit {proc.returncode}"
