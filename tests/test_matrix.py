"""counts.c (and libdemo.so with uselib) at -O0/-O2/-O3 x PIE/no-PIE/static/shared x CET on/off.

For each build, every function is probed (`-p '*'`); then:
- disarmed (no UREWRITE_DIR), the rewritten program behaves exactly like the original;
- under `urewrite stat`, its output is unchanged, its exit status is passed
  through, and the noinline functions were hit exactly as often as the sample's
  comment says;
- those counts equal what kernel uprobes on the original file count.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import StatRun, rewrite, run, stat, urewrite
from variants import (COUNTS_EXPECTED, IDS, STARTUP_FUNCTIONS, VARIANTS, Subject, expected_counts,
                      make_subject)


@pytest.fixture(params=VARIANTS, ids=IDS)
def subject(request, builder) -> Subject:
    return make_subject(builder, *request.param)


def test_every_own_function_is_probed(subject):
    """'*' probes every function of the sample's own code; refusals are reasons, not errors."""
    probed = {p["name"] for p in subject.result["probes"]}
    refused = {r["name"]: r["reason"] for r in subject.result["refused"]}
    for name in subject.own_functions:
        assert name in probed, f"{name} not probed: {refused.get(name)}"
    for p in subject.result["probes"]:
        assert p["kind"] == "entry"
        assert p["displaced"] >= (5 if p["tactic"] == "jump" else 2)
    for r in subject.result["refused"]:
        assert r["reason"]


def test_disarmed_behaves_like_the_original(subject):
    original = subject.original_run
    probed = run(subject.probed_command, env=subject.env_probed)
    assert probed.returncode == original.returncode == subject.exit_code
    assert probed.stdout == original.stdout
    assert probed.stderr == original.stderr


def test_stat_counts_are_exact(subject, session_dir):
    """stat --json on stdout: the program's output first, unchanged, then the report."""
    original = subject.original_run
    proc = urewrite("stat", "--json", "--", *subject.probed_command, env=subject.env_probed)
    assert proc.returncode == subject.exit_code, proc.stderr
    assert proc.stdout.startswith(original.stdout)
    report = json.loads(proc.stdout[len(original.stdout):])
    assert proc.stderr == original.stderr
    assert report["exit_code"] == subject.exit_code
    assert report["processes"] == 1
    st = StatRun(proc, report)
    objects = {p["object"] for p in report["probes"]}
    assert objects == {subject.object_name}
    expected = expected_counts(subject, original.stdout)
    hits = st.by_address()
    got = {name: hits.get(subject.own_functions[name]) for name in expected}
    assert got == expected
    # every probe of the report is one the rewrite placed, at the same address
    placed = {(p["name"], p["address"]) for p in subject.result["probes"]}
    assert {(p["name"], p["address"]) for p in report["probes"]} == placed


def test_counts_equal_uprobe_oracle(subject, uprobes, session_dir):
    """Every probed function of the sample's own code: hits == kernel uprobe hits on the original."""
    st = stat(subject.probed_command, session_dir, env=subject.env_probed)
    assert st.proc.returncode == subject.exit_code
    probed = {p["address"] for p in subject.result["probes"]}
    addresses = {n: a for n, a in subject.own_functions.items() if a in probed}
    assert addresses
    # and some start-up code: crt's, and in a static program libc's
    addresses.update({p["name"]: p["address"] for p in subject.result["probes"]
                      if p["name"] in STARTUP_FUNCTIONS})
    runs = []
    oracle = uprobes.count(subject.original, addresses,
                           lambda: runs.append(subject.run_original({"UREWRITE_DIR": str(session_dir)})))
    assert runs[0].returncode == subject.exit_code
    assert runs[0].stdout == subject.original_run.stdout
    hits = st.by_address()
    assert {n: hits[a] for n, a in addresses.items()} == oracle


def test_static_pie(builder, session_dir):
    """-static-pie, outside the matrix: a static program that relocates itself."""
    built = builder.build("counts", ["counts.c"], ["-O2"], ["-static-pie"])
    original = run([built.path])
    probed = built.dir / "counts.probed"
    rewrite(built.path, probed, "*")
    disarmed = run([probed])
    assert (disarmed.returncode, disarmed.stdout, disarmed.stderr) == \
        (original.returncode, original.stdout, original.stderr) == (3, original.stdout, "")
    st = stat([probed], session_dir)
    assert st.proc.returncode == 3 and st.proc.stdout == original.stdout
    hits = st.by_address()
    cmp_calls = int(re.search(r"^cmp_calls=(\d+)$", original.stdout, re.M).group(1))
    expected = {**COUNTS_EXPECTED, "cmp_int": cmp_calls}
    assert {n: hits[built.own_functions[n]] for n in expected} == expected

