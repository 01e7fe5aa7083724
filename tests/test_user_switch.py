"""Processes that change their user still count (reader/directories.py, region_directory).

Run by root, `stat`, `trace` and `stat --interval` give the command a region
directory any user can create files in but not list, inside a holder others
cannot list; each process creates its region 0600 as its own user. Programs are
started through setpriv, runuser and su, and samples/dropping_server.c forks
workers that switch to nobody, as servers do: the counts must be exact, and no
other user may read a region or list the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import SAMPLES, check, rewrite, stat, urewrite
from users import REQUESTS, SERVED, WORKERS, needs_switching, nobody_ids, switch_users
from variants import COUNTS_EXPECTED, COUNTS_EXIT


pytestmark = needs_switching


@pytest.fixture(scope="module")
def programs():
    """A directory every user may read (the programs run as nobody), with counts.c and
    samples/dropping_server.c and their rewritten copies."""
    d = Path(tempfile.mkdtemp(prefix="urewrite-user-switch-"))
    os.chmod(d, 0o755)
    try:
        check(["gcc", "-O2", SAMPLES / "counts.c", "-o", d / "counts"])
        check(["gcc", "-O2", SAMPLES / "dropping_server.c", "-o", d / "server"])
        rewrite(d / "counts", d / "counts.probed", "*")
        rewrite(d / "server", d / "server.probed", "*", extra=["-r", "handle_request"])
        # a worker's first hit after it switched user: it creates its region as nobody
        rewrite(d / "server", d / "server-late.probed", "handle_request",
                extra=["-r", "handle_request"])
        for p in d.iterdir():
            os.chmod(p, 0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _check_counts(run) -> None:
    assert run.proc.returncode == COUNTS_EXIT, run.proc.stderr
    assert "no probe region" not in run.proc.stderr, run.proc.stderr
    for name, hits in COUNTS_EXPECTED.items():
        assert run.hits(name) == hits, name
    assert run.report["processes"] == 1


def test_setpriv(programs, tmp_path):
    uid, gid = nobody_ids()
    run = stat(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                programs / "counts.probed"], tmp_path)
    _check_counts(run)


@pytest.mark.skipif(shutil.which("runuser") is None, reason="runuser is not installed")
def test_runuser(programs, tmp_path):
    run = stat(["runuser", "-u", "nobody", "--", programs / "counts.probed"], tmp_path)
    _check_counts(run)


@pytest.mark.skipif(shutil.which("su") is None, reason="su is not installed")
def test_su(programs, tmp_path):
    probe = subprocess.run(["su", "-s", "/bin/sh", "nobody", "-c", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"su cannot start a shell as nobody here: {probe.stderr.decode()!r}")
    run = stat(["su", "-s", "/bin/sh", "nobody", "-c", str(programs / "counts.probed")],
               tmp_path)
    _check_counts(run)


def _server(programs, name="server.probed"):
    uid, gid = nobody_ids()
    return [programs / name, uid, gid, WORKERS, REQUESTS]


def _entries(probes, name: str) -> int:
    return sum(p["hits"] for p in probes if p["name"] == name and p["kind"] == "entry")


def test_a_server_whose_workers_switch_user(programs, tmp_path):
    """Every call counted once, in the parent (root) and in each worker (its region
    made before it switched user, it keeps counting into it); the histogram
    (handle_request is probed at return too, calls timed) holds a sample per call."""
    run = stat(_server(programs), tmp_path, latency=True)
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout == f"served {SERVED}\n"
    assert run.report["processes"] == 1 + WORKERS
    assert _entries(run.probes, "handle_request") == SERVED
    assert _entries(run.probes, "worker") == WORKERS
    assert _entries(run.probes, "drop_privileges") == WORKERS
    assert _entries(run.probes, "main") == 1
    (ret,) = [p for p in run.probes if p["name"] == "handle_request" and p["kind"] == "return"]
    assert ret["hits"] == SERVED
    assert sum(b["count"] for b in ret["histogram"]) == SERVED


@pytest.mark.parametrize("name, worker_user", [("server-late.probed", "nobody"),
                                               ("server.probed", "root")])
def test_regions_are_their_users_and_no_one_elses(programs, tmp_path, name, worker_user):
    """Seen from inside the run: the holder, the directory, and each region's mode and
    owner (a worker's is nobody's when its first hit comes after it switched user,
    else root's: it keeps the region it mapped); another user can neither list the
    directory nor read a region."""
    other = switch_users()[1].pw_name
    script = f"""
        "$@" > /dev/null || exit 9
        cd "$UREWRITE_DIR" || exit 9
        stat -c '%a %U' .. .
        stat -c '%a %U' *.ure
        as_other="setpriv --reuid={other} --regid={other} --clear-groups"
        $as_other ls .. > /dev/null 2>&1 && echo holder listed
        $as_other ls . > /dev/null 2>&1 && echo listed
        for f in *.ure; do
            $as_other cat "$f" > /dev/null 2>&1 && echo read "$f"
        done
        exit 0
    """
    proc = urewrite("stat", "--json", "-o", str(tmp_path / "report.json"), "--",
                    "sh", "-c", script, "sh", *map(str, _server(programs, name)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["711 root", "1733 root"]
    assert sorted(lines[2:]) == sorted([f"600 {worker_user}"] * WORKERS + ["600 root"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert _entries(report["probes"], "handle_request") == SERVED


def test_trace_counts_every_event(programs, tmp_path):
    out = tmp_path / "events.jsonl"
    proc = urewrite("trace", "--json", "-o", str(out), "--",
                    *map(str, _server(programs, "server-late.probed")))
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    entries = [e for e in events if e["probe"] == "handle_request" and e["kind"] == "entry"]
    assert len(entries) == SERVED
    assert len({e["pid"] for e in entries}) == 1 + WORKERS


def test_stat_interval_counts_the_workers(programs, tmp_path):
    report = tmp_path / "report.json"
    proc = urewrite("stat", "--json", "--interval", "0.2", "-o", str(report), "--",
                    *map(str, _server(programs, "server-late.probed")))
    assert proc.returncode == 0, proc.stderr
    last = json.loads(report.read_text().splitlines()[-1])
    assert _entries(last["probes"], "handle_request") == SERVED
    assert last["processes"] == 1 + WORKERS


def test_nothing_left_behind(programs, tmp_path):
    """The directory and its holder are gone after the run, files of nobody's too."""
    proc = urewrite("stat", "-o", str(tmp_path / "report"), "--", "sh", "-c",
                    'echo "$UREWRITE_DIR"; exec "$@" > /dev/null', "sh",
                    *map(str, _server(programs, "server-late.probed")))
    assert proc.returncode == 0, proc.stderr
    directory = Path(proc.stdout.strip())
    assert directory.parent.name.startswith("urewrite-")
    assert not directory.parent.exists()


def test_stat_pid_counts_workers_forked_while_armed(programs):
    """Armed live (`stat -p`) while root, the server forks workers that switch to nobody
    and set up their regions in the tracer's directory; the tracer counts them all
    and disarms them."""
    server = subprocess.Popen([*map(str, _server(programs, "server-late.probed")), "wait"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tracer = None
    try:
        pid = int(server.stdout.readline().split()[1])
        tracer = subprocess.Popen([sys.executable, "-m", "urewrite", "stat", "--json", "-p",
                                   str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        line = tracer.stderr.readline()
        assert "urewrite: armed pid" in line, line + tracer.stderr.read()
        out, _ = server.communicate("go\n", timeout=120)
        assert server.returncode == 0 and out == f"served {SERVED}\n"
        report, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, err
        assert "Traceback" not in err
        assert _entries(json.loads(report)["probes"], "handle_request") == SERVED
    finally:
        for proc in (server, tracer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_program_runs_in_workers_that_switched_user(programs, tmp_path):
    """Under `urewrite run`, every process makes its own maps (0600, its user's, named
    by its user and pid): the root parent's, and each worker's (nobody from its first
    hit on, as it needs nothing of root's); the tracer adds them up: every call, once."""
    script = """
        "$@" > /dev/null || exit 9
        cd "$UREWRITE_DIR" || exit 9
        stat -c '%a %U %n' *.maps maps.*
    """
    program = (f"uprobe:{programs / 'server-late.probed'}:handle_request "
               "{ @calls[tid] = count(); @all = count(); }")
    proc = urewrite("run", "-e", program, "--", "sh", "-c", script, "sh",
                    *map(str, _server(programs, "server-late.probed")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = [line.split() for line in proc.stdout.splitlines() if line.startswith("600 ")]
    uid = nobody_ids()[0]
    own = [(user, name.split(".")) for _, user, name in files if name.startswith("maps.")]
    assert sorted(user for user, _ in own) == ["nobody"] * WORKERS + ["root"], files
    assert all(len(parts) == 4 and parts[2] == str(uid if user == "nobody" else 0)
               for user, parts in own)  # maps.RUN.UID.PID
    assert len({parts[3] for _, parts in own}) == WORKERS + 1
    assert [user for _, user, name in files if name.endswith(".maps")] == ["root"]
    assert f"@all: {SERVED}\n" in proc.stdout
    calls = sorted(int(line.split(": ")[1]) for line in proc.stdout.splitlines()
                   if line.startswith("@calls["))
    assert calls == sorted([2 * REQUESTS] + [REQUESTS + i for i in range(WORKERS)])


def test_a_program_runs_in_a_command_of_another_user(programs):
    uid, gid = nobody_ids()
    proc = urewrite("run", "-e", f"uprobe:{programs / 'server-late.probed'}:handle_request "
                    "{ @all = count(); }", "--", "setpriv", f"--reuid={uid}", f"--regid={gid}",
                    "--clear-groups", *map(str, _server(programs, "server-late.probed")))
    # (the server, already nobody, fails to drop privileges in its workers: it handles
    # its own requests only, and exits 1)
    assert f"@all: {2 * REQUESTS}\n" in proc.stdout, proc.stdout + proc.stderr


def test_a_built_in_program_counts_in_workers_that_switched_user(programs, tmp_path):
    """A program built into the server's probes, under `stat`: the root parent and
    the nobody workers each make their user's maps; stat adds them up."""
    built = tmp_path / "server-built-in"
    proc = urewrite(str(programs / "server"), "-e", "uprobe:server:handle_request "
                    "{ @all = count(); @calls[tid] = count(); }", "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    os.chmod(tmp_path, 0o755)
    os.chmod(built, 0o755)
    report = tmp_path / "report.json"
    uid, gid = nobody_ids()
    run = urewrite("stat", "--json", "-o", str(report), "--", str(built), str(uid), str(gid),
                   str(WORKERS), str(REQUESTS))
    assert run.returncode == 0, run.stderr
    (program,) = json.loads(report.read_text())["programs"]
    maps = {m["data"] and next(iter(m["data"])): next(iter(m["data"].values()))
            for m in program["maps"]}
    assert maps["@all"] == SERVED
    assert sorted(maps["@calls"].values()) == \
        sorted([2 * REQUESTS] + [REQUESTS + i for i in range(WORKERS)])
