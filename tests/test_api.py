"""The Python API (urewrite.api, docs/api.md): a rewrite, a run and a directory's counts
with typed results, the same as the command line's; bad input raises UrewriteError with
the command line's one-line message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import urewrite
from urewrite.api import UrewriteError, read_counts, rewrite, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "programs", "values.c")


@pytest.fixture(scope="module")
def values(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("api") / "values"
    subprocess.run(["gcc", "-O2", SAMPLE, "-o", str(out)], check=True)
    return out


def test_rewrite_and_run_count_as_the_command_line_does(values, tmp_path):
    out = tmp_path / "values.probed"
    done = rewrite(str(values), str(out), probes=["work"], returns=["named"])
    assert done.output == str(out) and not done.refused
    assert sorted((p.name, p.kind) for p in done.placed) == [("named", "return"),
                                                             ("work", "entry")]
    assert all(p.tactic and p.displaced > 0 for p in done.placed)
    ran = run([str(out), "250"])
    assert ran.exit_status == 0 and ran.counts.processes == 1
    assert ran.counts.hits("work") == 250 and ran.counts.hits("named", "return") == 250
    report = tmp_path / "report.json"
    assert urewrite("stat", "--json", "-o", str(report), "--", str(out), "250").returncode == 0
    cli = {(p["name"], p["kind"]): p["hits"] for p in json.loads(report.read_text())["probes"]}
    assert {(p.name, p.kind): p.hits for p in ran.counts.probes} == cli


def test_a_program_built_in_and_a_directory_read(values, tmp_path):
    out = tmp_path / "values.built"
    done = rewrite(str(values), str(out), program="uprobe:values:work { @n = count(); }")
    assert [p.name for p in done.placed] == ["work"]
    (maps, dropped, faults), = run([str(out), "40"]).programs
    assert [(m.name, m.entries) for m in maps] == [("n", {(): 40})] and not dropped
    directory = tmp_path / "regions"
    directory.mkdir()
    for n in (10, 20):
        subprocess.run([str(out), str(n)], check=True, capture_output=True,
                       env=dict(os.environ, UREWRITE_DIR=str(directory)))
    counts = read_counts(str(directory))
    assert counts.processes == 2 and counts.hits("work") == 30


def test_bad_input_raises_the_command_lines_message(values, tmp_path):
    with pytest.raises(UrewriteError) as e:
        rewrite(str(values), str(tmp_path / "x"), probes=["nosuch_function"])
    proc = urewrite(str(values), "-p", "nosuch_function", "-o", str(tmp_path / "y"))
    assert proc.returncode == 1 and proc.stderr.strip() == f"urewrite: {e.value}"
    assert not (tmp_path / "x").exists()
