"""Probe programs on arm64 (under qemu-aarch64) in a server whose workers switch to
nobody (samples/dropping_server.c), as tests/test_user_switch.py checks on x86_64:
loaded by `urewrite run` and built into the probes, every call counted once.
(tests/test_aarch64_program_maps.py has commands started as another user, a built-in
program's maps and a maps file too small.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import check, urewrite
from cross import BP, CC, QEMU, emulate, needs
from users import REQUESTS, SERVED, WORKERS, needs_switching, nobody_ids

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "samples" / "dropping_server.c"

pytestmark = [
    needs(CC, QEMU),
    needs_switching,
]


@pytest.fixture(scope="module")
def programs():
    """A directory every user may read (the programs run as nobody): dropping_server.c
    for arm64, and its copy probed at handle_request (server-late: the workers' first
    hit comes after they switched user)."""
    d = Path(tempfile.mkdtemp(prefix="urewrite-arm64-users-"))
    os.chmod(d, 0o755)
    try:
        check([CC, "-O2", BP, str(SERVER), "-o", str(d / "server")])
        proc = urewrite(str(d / "server"), "-p", "handle_request", "-r", "handle_request",
                        "-o", str(d / "server-late"), "-q")
        assert proc.returncode == 0, proc.stderr
        for p in d.rglob("*"):
            os.chmod(p, 0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _server(programs, name="server-late"):
    uid, gid = nobody_ids()
    return [*emulate(programs / name), str(uid), str(gid), str(WORKERS), str(REQUESTS)]


def _calls(stdout: str):
    return sorted(int(line.split(": ")[1]) for line in stdout.splitlines()
                  if line.startswith("@calls["))


def test_a_program_runs_in_workers_that_switched_user(programs):
    """Every call counted once. (Under qemu-user the workers keep their parent's
    mappings across fork, MADV_WIPEONFORK being left undone: they count in the
    parent's maps, as one thread.)"""
    program = (f"uprobe:{programs / 'server-late'}:handle_request "
               "{ @calls[tid] = count(); @all = count(); }")
    proc = urewrite("run", "-e", program, "--", *_server(programs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"@all: {SERVED}\n" in proc.stdout
    assert sum(_calls(proc.stdout)) == SERVED


def test_a_built_in_program_counts_in_workers_that_switched_user(programs, tmp_path):
    """Under `stat`, where the built-in program's maps are always its user's own."""
    built = programs / "server-built-in"
    proc = urewrite(str(programs / "server"), "-e", "uprobe:server:handle_request "
                    "{ @all = count(); @calls[tid] = count(); }", "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    os.chmod(built, 0o755)
    report = tmp_path / "report.json"
    run = urewrite("stat", "--json", "-o", str(report), "--", *_server(programs, built.name))
    assert run.returncode == 0, run.stderr
    (program,) = json.loads(report.read_text())["programs"]
    maps = {m["data"] and next(iter(m["data"])): next(iter(m["data"].values()))
            for m in program["maps"]}
    assert maps["@all"] == SERVED
    assert sum(maps["@calls"].values()) == SERVED  # (one thread under qemu: above)


