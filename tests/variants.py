"""The build matrix shared by test_matrix.py and test_layout.py.

counts.c at -O0/-O2/-O3 x PIE/no-PIE/static x CET on/off, and libdemo.c as a
shared library (run by uselib.c) at the same levels; each rewritten with
`-p '*'`, once per session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from conftest import Builder, run, rewrite

OPTS = ["-O0", "-O2", "-O3"]
LINKS = ["pie", "no-pie", "static", "shared"]
CETS = ["-fcf-protection", "-fcf-protection=none"]

# samples/counts.c: entries per run, from the comment at the top of the file.
COUNTS_EXPECTED = {
    "main": 1, "square": 100, "fib": 1973, "add_one": 20, "twice": 20, "negate": 20,
    "apply": 60, "sort_numbers": 1, "classify": 200, "is_even": 6, "is_odd": 5,
    "total_length": 7, "make_buffer": 4, "release": 4, "report": 3, "never_called": 0,
}  # cmp_int: as many calls as the program reports (cmp_calls=N)
COUNTS_EXIT = 3

# samples/libdemo.c, run by samples/uselib.c
LIBDEMO_EXPECTED = {"demo_square": 50, "demo_fib": 465, "demo_each": 1, "demo_scale": 25,
                    "demo_version": 2, "demo_unused": 0}
USELIB_EXPECTED = {"main": 1, "visit": 25}
USELIB_EXIT = 5

# Start-up and libc functions also checked against the oracle where they are probed.
STARTUP_FUNCTIONS = ("_start", "frame_dummy", "register_tm_clones", "__libc_start_main",
                     "__libc_setup_tls", "_dl_relocate_static_pie", "__libc_init_secure",
                     "_dl_non_dynamic_init", "malloc", "free", "qsort", "printf", "exit")


@dataclass
class Subject:
    """One built variant, its rewritten copy, and how to run each."""
    link: str
    original: Path  # the file that was rewritten
    probed: Path  # its rewritten copy
    object_name: str  # how stat names the rewritten object
    command: List[str]  # runs the original
    probed_command: List[str]  # runs the rewritten copy (with env_probed)
    env_original: Dict[str, str]
    env_probed: Dict[str, str]
    exit_code: int
    expected: Dict[str, int]  # documented entry counts
    own_functions: Dict[str, int]  # name -> address, of the sample's own code
    result: dict  # what `urewrite --json` said
    original_run: object = None  # the original's CompletedProcess

    def run_original(self, env: Optional[Dict[str, str]] = None):
        return run(self.command, env={**self.env_original, **(env or {})})


def variant_id(opt, link, cet):
    return f"{opt[1:]}-{link}-{'cet' if cet == '-fcf-protection' else 'nocet'}"


VARIANTS = [(o, l, c) for o in OPTS for l in LINKS for c in CETS]
IDS = [variant_id(*v) for v in VARIANTS]

_subjects: Dict[tuple, Subject] = {}


def make_subject(builder: Builder, opt: str, link: str, cet: str) -> Subject:
    """Build, rewrite with -p '*' and run the original once; cached for the session."""
    key = (opt, link, cet)
    if key in _subjects:
        return _subjects[key]
    cflags = [opt, cet]
    if link == "shared":
        tag = variant_id(opt, link, cet)
        lib = builder.build("libdemo.so", ["libdemo.c"], cflags + ["-fPIC"],
                            ["-Wl,-soname,libdemo.so"], shared=True, subdir=f"lib-{tag}")
        prog = builder.build("uselib", ["uselib.c"], cflags, [f"-L{lib.dir}", "-ldemo"],
                             subdir=f"uselib-{tag}")
        probed_dir = lib.dir.parent / f"lib-{tag}-probed"
        probed_dir.mkdir(exist_ok=True)
        probed = probed_dir / "libdemo.so"  # same file name (and soname) as the original
        result = rewrite(lib.path, probed, "*")
        subject = Subject(link, lib.path, probed, "libdemo.so", [str(prog.path)], [str(prog.path)],
                          {"LD_LIBRARY_PATH": str(lib.dir)}, {"LD_LIBRARY_PATH": str(probed_dir)},
                          USELIB_EXIT, LIBDEMO_EXPECTED, lib.own_functions, result)
    else:
        cflags += {"pie": ["-fPIE"], "no-pie": ["-fno-pie"], "static": []}[link]
        built = builder.build("counts", ["counts.c"], cflags, [f"-{link}"])
        probed = built.dir / "counts.probed"
        result = rewrite(built.path, probed, "*")
        subject = Subject(link, built.path, probed, probed.name, [str(built.path)], [str(probed)],
                          {}, {}, COUNTS_EXIT, COUNTS_EXPECTED, built.own_functions, result)
    subject.original_run = subject.run_original()
    assert subject.original_run.returncode == subject.exit_code, subject.original_run.stderr
    _subjects[key] = subject
    return subject


def expected_counts(s: Subject, stdout: str) -> Dict[str, int]:
    """The documented counts; cmp_int's is what the program itself counted."""
    expected = dict(s.expected)
    if "cmp_int" in s.own_functions:
        m = re.search(r"^cmp_calls=(\d+)$", stdout, re.M)
        assert m, stdout
        expected["cmp_int"] = int(m.group(1))
        assert expected["cmp_int"] > 64  # qsort of 64 numbers compares more often than that
    return expected
