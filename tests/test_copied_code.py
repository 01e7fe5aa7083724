"""Code the program copies at run time (samples/copied_code.c, a stand-in for V8's
embedded builtins) is never patched: `-p '*'` leaves it out with a reason that names
it, and the program, which runs the copy, behaves as the original. Without the
check the copy's patched jump leads nowhere and the program crashes (checked by
hand when the check was written). Also `--exclude`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import check, stat, urewrite
import cross

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "copied_code.c"
CALLS = 25
BUILTINS = ("Builtins_Twice", "Builtins_Square")
EXPECTED_OUTPUT = "original 7075 copied 5600\n"  # sums over i < 25 (see the sample)


def _build(tmp_path: Path, cc: str, flags) -> Path:
    out = tmp_path / "copied_code"
    check([cc, *flags, str(SAMPLE), "-o", str(out)])
    return out


def _rewrite_all(program: Path, *extra: str) -> dict:
    proc = urewrite(str(program), "-p", "*", "-o", f"{program}.probed", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _check_refusals(result: dict) -> None:
    refused = {r["name"]: r["reason"] for r in result["refused"]}
    assert set(BUILTINS) <= set(refused)
    for name in BUILTINS:
        assert "V8's embedded builtins (v8_Default_embedded_blob_code_" in refused[name]
        assert "copies elsewhere at run time" in refused[name]
    probed = {p["name"] for p in result["probes"]}
    assert "plain" in probed and "main" in probed and not probed & set(BUILTINS)


@pytest.mark.parametrize("flags", [["-O0", "-pie"], ["-O2", "-no-pie"], ["-O2", "-static"]],
                         ids=lambda f: "-".join(x.lstrip("-") for x in f))
def test_every_function_but_the_copied_ones(tmp_path, flags):
    program = _build(tmp_path, "gcc", flags)
    assert check([program, str(CALLS)]).stdout == EXPECTED_OUTPUT
    _check_refusals(_rewrite_all(program))
    probed = Path(f"{program}.probed")
    assert check([probed, str(CALLS)]).stdout == EXPECTED_OUTPUT  # disarmed
    armed = stat([probed, str(CALLS)], tmp_path)
    assert armed.proc.returncode == 0 and armed.proc.stdout == EXPECTED_OUTPUT
    assert armed.hits("plain") == CALLS and armed.hits("main") == 1


def test_a_copied_function_named_exactly_is_an_error(tmp_path):
    program = _build(tmp_path, "gcc", ["-O2"])
    proc = urewrite(str(program), "-p", "Builtins_Twice", "-o", str(tmp_path / "out"))
    assert proc.returncode == 1 and not (tmp_path / "out").exists()
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "cannot probe Builtins_Twice: it lies in V8's embedded builtins" in proc.stderr


def test_exclude_leaves_functions_out(tmp_path):
    program = _build(tmp_path, "gcc", ["-O2"])
    result = _rewrite_all(program, "--exclude", "pla*", "--exclude", "Builtins_*")
    probed = {p["name"] for p in result["probes"]}
    assert "plain" not in probed and "main" in probed
    assert not {r["name"] for r in result["refused"]} & set(BUILTINS)  # left out, not refused
    armed = stat([f"{program}.probed", str(CALLS)], tmp_path)
    assert armed.proc.stdout == EXPECTED_OUTPUT
    assert "plain" not in {p["name"] for p in armed.probes} and armed.hits("main") == 1
    proc = urewrite(str(program), "-p", "plain", "--exclude", "*", "-o", str(tmp_path / "none"))
    assert proc.returncode == 1 and "--exclude leaves no site to probe" in proc.stderr
    assert not (tmp_path / "none").exists()


@cross.needs(cross.CC, cross.QEMU)
def test_on_arm64(tmp_path):
    program = _build(tmp_path, cross.CC, ["-O2"])
    assert check(cross.emulate(program) + [str(CALLS)]).stdout == EXPECTED_OUTPUT
    _check_refusals(_rewrite_all(program))
    probed = Path(f"{program}.probed")
    report = tmp_path / "report.json"
    proc = urewrite("stat", "--json", "-o", str(report), "--",
                        *cross.emulate(probed), str(CALLS))
    assert proc.returncode == 0 and proc.stdout == EXPECTED_OUTPUT, proc.stderr
    hits = {p["name"]: p["hits"] for p in json.loads(report.read_text())["probes"]}
    assert hits["plain"] == CALLS and hits["main"] == 1
