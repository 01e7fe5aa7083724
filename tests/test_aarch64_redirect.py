"""Return probes by return-address redirection on arm64, under qemu-aarch64: the
fallback for functions whose exits cannot all be patched (tests/test_redirect.py
checks it on x86_64).

On arm64 nearly every exit can be patched, so the rewrites here set
UREWRITE_REDIRECT_RETURNS, which makes every return probe redirect wherever that
is allowed: samples/redirect.c and samples/returns.c (recursion, threads, longjmp,
a signal handler, tail calls, fork, a function that never returns) at -O0/-O2, PIE
and static, with and without -mbranch-protection=standard, where functions that
sign their return address (paciasp) are refused redirection and keep their exit
patches. Each build is rewritten once (`--tactics jump`, accepted on both
architectures); every case then runs with the same output and exit status as the
original, disarmed and under `urewrite stat`, and counts exactly the returns the
test knows the sample makes. An indirect tail call (`br`) at -O2 needs redirection
without the variable. Refusals: pointer authentication, reads of x30, returns-twice
functions, a loop back to the entry, the Guarded Control Stack; and a return whose
entry was lost to a stack switch stops the process with a message.
"""

from __future__ import annotations

import json
import struct
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from conftest import check, run, urewrite
from cross import BP, CC, QEMU, Run, emulate, exit_status, needs, prepare_all

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
FORCE = {"UREWRITE_REDIRECT_RETURNS": "1"}
# the same programs as on x86_64 (tests/test_redirect.py)
COROUTINES = (SAMPLES / "coroutines.c").read_text()
COROUTINE_USER = (SAMPLES / "coroutine_user.c").read_text()

pytestmark = needs(CC, QEMU)

# What each case of each sample returns, known independently of the program (its
# own count is not trusted: at -O2 a local changed between setjmp and longjmp is not).
REDIRECT_FUNCTIONS = ("depth", "work", "maybe_jump", "dive", "nested", "twice", "via",
                      "via_twice", "forker", "die")
REDIRECT_CASES = {
    ("recursion",): {"depth": 10001},
    ("threads",): {"work": 1_000_000},
    ("longjmp",): {"maybe_jump": 75},
    ("dive",): {"dive": 0, "depth": 2020},
    ("signal",): {"nested": 100},
    ("tail",): {"via": 30, "twice": 30},
    ("chain",): {"via": 40, "twice": 20, "via_twice": 20},
    ("fork",): {"forker": 2},  # qemu shares the region with the child: one report
    ("die", "2"): {"die": 0},
}
RETURNS_FUNCTIONS = ("depth", "work", "maybe_jump", "nested", "tail", "callee")
RETURNS_CASES = {
    ("recursion",): {"depth": 10001},
    ("threads",): {"work": 1_000_000},
    ("longjmp",): {"maybe_jump": 75},
    ("signal",): {"nested": 100},
    ("tail",): {"tail": 50, "callee": 29},
}
SAMPLE = {"redirect": ("redirect.c", REDIRECT_FUNCTIONS, REDIRECT_CASES),
          "returns": ("returns.c", RETURNS_FUNCTIONS, RETURNS_CASES)}
EXIT_CODES = {("die", "2"): 2}


@dataclass(frozen=True)
class Variant:
    sample: str
    opt: str
    static: bool
    bp: bool

    @property
    def id(self) -> str:
        return f"{self.sample}{self.opt}-{'static' if self.static else 'pie'}" + \
            ("-bp" if self.bp else "")


VARIANTS = [Variant("redirect", "-O0", False, False), Variant("redirect", "-O2", True, True),
            Variant("redirect", "-O2", False, False), Variant("returns", "-O0", True, True),
            Variant("returns", "-O2", False, True)]
CASES = [(v.id, args) for v in VARIANTS for args in SAMPLE[v.sample][2]]


@dataclass
class Prepared:
    variant: Variant
    dir: Path
    plain: Optional[Path] = None
    probed: Optional[Path] = None
    mechanisms: Dict[str, dict] = field(default_factory=dict)  # forced: name -> return
    natural: Dict[str, dict] = field(default_factory=dict)  # without the variable
    runs: Dict[Tuple[str, ...], Tuple[Run, Run, Run]] = field(default_factory=dict)
    error: Optional[str] = None

    def ok(self) -> "Prepared":
        if self.error:
            pytest.fail(f"preparing {self.variant.id} failed:\n{self.error}", pytrace=False)
        return self


def _urewrite_env(*args, env=None):
    return run([sys.executable, "-m", "urewrite", *map(str, args)], env=env)


def _returns(path, env=None) -> Dict[str, dict]:
    out = _urewrite_env("list", "--json", path, env=env)
    assert out.returncode == 0, out.stderr
    return {f["name"]: f["return"] for f in json.loads(out.stdout)["functions"]}


def _outcome(proc) -> Run:
    return Run(exit_status(proc.returncode), proc.stdout, proc.stderr)


def _prepare(v: Variant, root: Path) -> Prepared:
    p = Prepared(v, root / v.id)
    source, functions, cases = SAMPLE[v.sample]
    try:
        p.dir.mkdir(parents=True)
        p.plain, p.probed = p.dir / v.sample, p.dir / f"{v.sample}.probed"
        flags = [v.opt, "-pthread"] + ([BP] if v.bp else []) + \
            (["-static"] if v.static else ["-fPIE", "-pie"])
        check([CC, *flags, SAMPLES / source, "-o", p.plain])
        p.mechanisms = _returns(p.plain, FORCE)
        p.natural = _returns(p.plain)
        specs = [a for name in functions for a in ("-r", name)] + ["-p", "depth", "-p", "work"]
        if v.static:  # returns with another thread pointer than it was entered with
            specs += ["-r", "__libc_setup_tls"]
        out = _urewrite_env(p.plain, *specs, "--tactics", "jump", "-o", p.probed, env=FORCE)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        for args in cases:
            original = _outcome(run(emulate(p.plain) + list(args)))
            disarmed = _outcome(run(emulate(p.probed) + list(args)))
            report = p.dir / f"report-{'-'.join(args)}.json"
            proc = urewrite("stat", "--json", "-o", str(report), "--",
                            *emulate(p.probed), *args)
            armed = _outcome(proc)
            assert report.exists(), f"stat wrote no report:\n{proc.stderr}"
            armed.report = json.loads(report.read_text())
            p.runs[args] = (original, disarmed, armed)
    except Exception:  # reported by each test of the variant
        p.error = traceback.format_exc()
    return p


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Dict[str, Prepared]:
    return prepare_all(tmp_path_factory, "aarch64-redirect", VARIANTS, _prepare)


@pytest.mark.parametrize("vid", [v.id for v in VARIANTS])
def test_return_probes_redirect_unless_the_function_signs_its_return_address(prepared, vid):
    p = prepared[vid].ok()
    functions = SAMPLE[p.variant.sample][1]
    redirected = {n for n in functions if p.mechanisms[n]["mechanism"] == "redirection"}
    assert all(p.mechanisms[n]["mechanism"] for n in functions)  # none refused
    if not p.variant.bp:
        assert redirected == set(functions)
        return
    # with pointer authentication, the functions that sign x30 keep their exit patches
    from urewrite.rewriter import redirection
    from urewrite.rewriter.pipeline import analyse
    a = analyse(str(p.plain))
    frames = redirection.entry_frames(a.elf)
    by_name = {name: fn for fn in a.functions for name in fn.names}
    assert redirected, "nothing redirected"
    for name in set(functions) - redirected:
        problem = redirection.function_problem(a.elf, a.planner.backend, by_name[name], frames)
        assert "'paciasp' at" in problem and "pointer authentication" in problem, (name, problem)
    assert "work" in redirected  # a leaf: bti c, no paciasp


def test_an_indirect_tail_call_is_an_exit_without_the_variable(prepared):
    """`br` of a tail call through a pointer: an exit checked where it goes."""
    p = prepared["redirect-O2-pie"].ok()
    assert p.natural["via"]["mechanism"] == "exit sites"


@pytest.mark.parametrize("vid,args", CASES, ids=[f"{v}-{'-'.join(a)}" for v, a in CASES])
def test_runs_like_the_original_and_counts_returns_exactly(prepared, vid, args):
    p = prepared[vid].ok()
    original, disarmed, armed = p.runs[args]
    assert original.returncode == EXIT_CODES.get(args, 0), original.stderr
    assert (disarmed.returncode, disarmed.stdout) == (original.returncode, original.stdout)
    assert (armed.returncode, armed.stdout) == (original.returncode, original.stdout), \
        armed.stderr
    assert "could not redirect" not in armed.stderr and "lost" not in armed.stderr
    hits = {(q["name"], q["kind"]): q["hits"] for q in armed.report["probes"]}
    expected = SAMPLE[p.variant.sample][2][args]
    for name in SAMPLE[p.variant.sample][1]:
        assert hits[(name, "return")] == expected.get(name, 0), name
    if args == ("recursion",):
        assert hits[("depth", "entry")] == 10001
    if args == ("threads",):
        assert hits[("work", "entry")] == 1_000_000
    if p.variant.static:  # the stand-in thread pointer was replaced by libc's meanwhile
        assert p.mechanisms["__libc_setup_tls"]["mechanism"] == "redirection"
        assert hits[("__libc_setup_tls", "return")] == 1


def test_redirected_returns_are_traced_with_their_value(prepared):
    p = prepared["redirect-O0-pie"].ok()
    out = urewrite("trace", "--json", "--", *emulate(p.probed), "tail")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    returns = [(e["probe"], e["args"][0]) for e in events if e["kind"] == "return"]
    assert returns == [(name, 2 * x) for x in range(30) for name in ("twice", "via")]


REFUSED = r"""
#include <setjmp.h>
#include <stdio.h>
static volatile int sink;
__attribute__((noipa)) int helper(int x) { return x + sink; }
/* signs x30 (paciasp), then leaves by an indirect tail call: an exit checked where
   it goes; redirected, the stub's address would fail autiasp */
__attribute__((noipa)) int signed_via(int (*f)(int), int x) { return f(helper(x)); }
__attribute__((noipa)) void *whence(int x) {
    if (x < 0)
        return 0;
    return __builtin_return_address(0);
}
int main(int argc, char **argv) {
    jmp_buf jb;
    if (setjmp(jb) == 0)
        printf("%d %d\n", signed_via(helper, argc), whence(1) != 0);
    return 0;
}
"""
LOOP = (".text\n.globl loop\n.type loop, %function\nloop:\n .cfi_startproc\n"
        " subs x0, x0, #1\n b.ne loop\n ret\n .cfi_endproc\n.size loop, .-loop\n")


def test_refusals_and_their_reasons(tmp_path):
    """Pointer authentication, a read of x30, a function that may return twice, a jump
    back to the entry: each refused, with its reason."""
    from urewrite.rewriter import redirection
    from urewrite.rewriter.pipeline import analyse

    (tmp_path / "refused.c").write_text(REFUSED)
    plain = tmp_path / "refused"
    check([CC, "-O2", BP, "-static", tmp_path / "refused.c", "-o", plain])
    assert _returns(plain)["signed_via"]["mechanism"] == "exit sites"
    signed = analyse(str(plain))
    fn = next(fn for fn in signed.functions if "signed_via" in fn.names)
    problem = redirection.function_problem(signed.elf, signed.planner.backend, fn,
                                           redirection.entry_frames(signed.elf))
    assert "'paciasp' at" in problem and "pointer authentication" in problem
    out = urewrite(plain, "-r", "signed_via", "-o", tmp_path / "out")
    assert out.returncode == 0, out.stderr
    assert run(emulate(tmp_path / "out")).stdout == run(emulate(plain)).stdout

    unsigned = tmp_path / "unsigned"  # where pointer authentication says nothing first
    check([CC, "-O2", "-static", tmp_path / "refused.c", "-o", unsigned])
    a = analyse(str(unsigned))
    frames = redirection.entry_frames(a.elf)
    by_name = {name: fn for fn in a.functions for name in fn.names}

    def problem(name):
        return redirection.function_problem(a.elf, a.planner.backend, by_name[name], frames)
    assert "reads its return address" in problem("whence")
    assert "may return twice" in problem("_setjmp")
    assert "entry point" in problem("_start")
    assert problem("helper") is None

    (tmp_path / "loop.s").write_text(LOOP)
    (tmp_path / "main.c").write_text("long loop(long);\nint main(void) { return loop(3); }\n")
    check([CC, "-O2", tmp_path / "main.c", tmp_path / "loop.s", "-o", tmp_path / "loop"])
    a = analyse(str(tmp_path / "loop"))
    fn = next(fn for fn in a.functions if "loop" in fn.names)
    assert "jumps back to its entry" in redirection.function_problem(
        a.elf, a.planner.backend, fn, redirection.entry_frames(a.elf))


def _with_gcs(data: bytearray) -> bytearray:
    """Sets the GCS bit of the arm64 feature property in the GNU property note."""
    at = data.find(struct.pack("<II", 0xC0000000, 4))
    assert at > 0, "no GNU_PROPERTY_AARCH64_FEATURE_1_AND"
    value, = struct.unpack_from("<I", data, at + 8)
    struct.pack_into("<I", data, at + 8, value | 4)
    return data


GCS_LIBRARY = r"""
/* an indirect tail call: redirected, unless the file enables the GCS */
__attribute__((noipa)) int via(int (*f)(int), int x) { return f(x); }
void lib_init(void) {}
"""


def test_refused_under_the_guarded_control_stack(tmp_path):
    """A library linked without start files keeps its GNU property note; its GCS bit
    is set by hand (this toolchain cannot mark one)."""
    (tmp_path / "gcs.c").write_text(GCS_LIBRARY)
    plain = tmp_path / "libgcs.so"
    check([CC, "-O2", BP, "-fPIC", "-shared", "-nostartfiles", "-Wl,-init,lib_init",
           tmp_path / "gcs.c", "-o", plain])
    from urewrite.rewriter import redirection
    from urewrite.rewriter.pipeline import analyse
    assert _returns(plain, FORCE)["via"]["mechanism"] == "redirection"
    plain.write_bytes(_with_gcs(bytearray(plain.read_bytes())))
    a = analyse(str(plain))
    assert "the file enables the Guarded Control Stack" in \
        redirection.file_problem(a.elf, a.planner.backend)
    assert _returns(plain, FORCE)["via"]["mechanism"] == "exit sites"  # patched instead


def test_stack_switching(tmp_path):
    """A file that switches stacks is refused; switched in a library, a suspended
    frame loses its entry and the program stops with a message at its return."""
    (tmp_path / "co.c").write_text(COROUTINES)
    (tmp_path / "user.c").write_text(COROUTINE_USER)
    (tmp_path / "all.c").write_text(COROUTINES + COROUTINE_USER)
    check([CC, "-O0", tmp_path / "all.c", "-o", tmp_path / "all"])
    from urewrite.rewriter import redirection
    from urewrite.rewriter.pipeline import analyse
    a = analyse(str(tmp_path / "all"))
    assert "the file switches stacks" in redirection.file_problem(a.elf, a.planner.backend)
    assert _returns(tmp_path / "all", FORCE)["inner"]["mechanism"] == "exit sites"

    check([CC, "-O0", "-shared", "-fPIC", tmp_path / "co.c", "-o", tmp_path / "libco.so"])
    plain, probed = tmp_path / "user", tmp_path / "user.probed"
    check([CC, "-O0", tmp_path / "user.c", f"-L{tmp_path}", "-lco", "-o", plain])
    assert _returns(plain, FORCE)["inner"]["mechanism"] == "redirection"
    out = _urewrite_env(plain, "-r", "inner", "-r", "outer", "-o", probed, env=FORCE)
    assert out.returncode == 0, out.stderr
    assert run(emulate(plain, tmp_path)).stdout == "done\n"
    out = urewrite("stat", "--", *emulate(probed, tmp_path))
    assert out.returncode == 128 + 4, out.stderr  # SIGILL: udf
    assert "urewrite: a redirected return address was lost; stopping" in out.stderr
