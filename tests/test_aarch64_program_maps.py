"""Where an arm64 process's probe program keeps its maps, under qemu-aarch64: what
tests/test_user_switch.py and tests/test_programs.py check on x86_64.

- A process that changed its user (setpriv to nobody) cannot open the tracer's maps
  (root's, 0600): it makes its user's own, maps.RUN.UID, and the tracer adds them up;
  two such processes share them, and every call counts exactly once.
- A program built into the probes (`urewrite IN -e PROGRAM -o OUT`) runs under
  `urewrite stat` with no tracer's program: stat's maps are the ones `urewrite run`
  gathers with the same program; two processes of a --dir directory add up; in a
  BTI-guarded shared library too (run_program calls the program's functions through
  a register: each starts with a landing pad).
- A user's maps file smaller than the area the program's code writes is not mapped.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import check, urewrite
from cross import CC, QEMU, emulate, needs
from probe_programs import VALUES, bti_library, build_arm64, evaluated, maps_of, ties_sorted

pytestmark = needs(CC, QEMU)

COUNTS = ("uprobe:{path}:work /arg0 % 3 != 1/ {{ @c[arg1] = count(); @s = sum(arg0); }} "
          "uretprobe:{path}:work {{ @r = sum((int64)retval); @h = hist(retval); }}")


def _nobody():
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


@pytest.fixture(scope="module")
def shared_dir():
    """A directory every user may read (the programs run as nobody: pytest's tmp_path
    is 0700), with values.c built for arm64 and rewritten with COUNTS's probes."""
    d = Path(tempfile.mkdtemp(prefix="urewrite-arm64-maps-"))
    try:
        rewritten = build_arm64(d, VALUES, "values", ["-O2", "-pthread"],
                           lambda path: COUNTS.format(path=path))
        for p in [d, *d.rglob("*")]:
            os.chmod(p, 0o755)
        yield rewritten
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not _nobody(),
                    reason="needs root (to switch user), setpriv and the user nobody")
def test_processes_of_another_user_have_their_own_maps(shared_dir):
    """`run -- setpriv ... qemu-aarch64 prog`, twice in one command: both processes
    are nobody's; each makes its own maps.RUN.UID.PID (nobody's, 0600); the tracer
    adds them up: both runs' calls, exactly."""
    nobody = _nobody()
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                 "--clear-groups"]
    program = COUNTS.format(path=shared_dir)
    single = urewrite("run", "-e", program, "--", *as_nobody, *emulate(shared_dir), "700")
    assert single.returncode == 0, single.stderr
    expected, _ = evaluated(program, 700)
    assert ties_sorted(maps_of(single.stdout)) == ties_sorted(expected)
    command = " ".join(as_nobody + emulate(shared_dir))
    script = f"""
        {command} 500 > /dev/null || exit 9
        {command} 500 > /dev/null || exit 9
        cd "$UREWRITE_DIR" || exit 9
        stat -c '%a %U %n' maps.*
    """
    twice = urewrite("run", "-e", program, "--", "sh", "-c", script)
    assert twice.returncode == 0, twice.stdout + twice.stderr
    files = [line.split() for line in twice.stdout.splitlines() if line.startswith("600 ")]
    assert [(mode, user, name.split(".")[0], name.split(".")[2]) for mode, user, name in files] \
        == [("600", "nobody", "maps", str(nobody.pw_uid))] * 2
    once, _ = evaluated(program, 500)
    doubled = {}
    for line in once.splitlines():  # each count and sum twice over (hist buckets too)
        if line.startswith("@c[") or line.startswith("@s:") or line.startswith("@r:"):
            key, value = line.rsplit(": ", 1)
            doubled[key] = 2 * int(value)
    got = dict(line.rsplit(": ", 1) for line in maps_of(twice.stdout).splitlines()
               if line.startswith(("@c[", "@s:", "@r:")))
    assert {key: int(value) for key, value in got.items()} == doubled


def _built_in_maps(report: Path) -> list:
    (program,) = json.loads(report.read_text())["programs"]
    assert program["dropped"] == 0 and program["faults"] == 0
    return program["maps"]


def test_a_built_in_program_runs_whenever_the_probes_are_armed(tmp_path):
    rewritten = build_arm64(tmp_path, VALUES, "values", ["-O2", "-pthread"],
                       lambda path: COUNTS.format(path=path))
    program = COUNTS.format(path=rewritten)
    report = tmp_path / "report.json"
    stat = urewrite("stat", "--json", "-o", str(report), "--", *emulate(rewritten), "300")
    assert stat.returncode == 0, stat.stderr
    built_in = _built_in_maps(report)
    ran = urewrite("run", "--json", "-e", program, "--", *emulate(rewritten), "300")
    assert ran.returncode == 0, ran.stderr
    loaded = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert built_in == loaded
    total = sum(3 * i - 500 * (i % 7) for i in range(300))
    assert {"type": "map", "data": {"@r": total}} in built_in
    interval = urewrite("stat", "--interval", "0.2", "--", *emulate(rewritten), "300")
    assert interval.returncode == 0, interval.stderr
    assert f"@r: {total}\n" in interval.stdout
    # two processes of a directory: their maps added up
    directory = tmp_path / "dir"
    directory.mkdir()
    for _ in range(2):
        check(emulate(rewritten) + ["300"], env={"UREWRITE_DIR": str(directory)})
    watched = urewrite("stat", "--dir", str(directory), "--duration", "0.1")
    assert watched.returncode == 0, watched.stderr
    assert "the program built into the probes:" in watched.stdout
    assert f"@r: {2 * total}\n" in watched.stdout


def test_a_built_in_program_in_a_bti_guarded_library(tmp_path):
    """The library keeps its BTI marking (no start files), so qemu maps its pages
    guarded: the program's functions, in the rewrite's segment, are called through a
    register."""
    library, rewritten, main = bti_library(tmp_path)
    program = COUNTS.format(path=rewritten)
    proc = urewrite(str(library), "-e", program, "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "report.json"
    stat = urewrite("stat", "--json", "-o", str(report), "--",
                    *emulate(main, tmp_path / "rw"), "900", "3")
    assert stat.returncode == 0, stat.stderr
    expected, _ = evaluated(program, 900, threads=3)
    ran = urewrite("run", "-e", program, "--", *emulate(main, tmp_path / "rw"), "900", "3")
    assert ran.returncode == 0, ran.stderr
    assert ties_sorted(maps_of(ran.stdout)) == ties_sorted(expected)
    loaded = urewrite("run", "--json", "-e", program, "--",
                      *emulate(main, tmp_path / "rw"), "900", "3")
    assert loaded.returncode == 0, loaded.stderr
    assert _built_in_maps(report) == [json.loads(line) for line in loaded.stdout.splitlines()
                                      if line.startswith("{")]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a process of pid 1, in a namespace)")
def test_maps_smaller_than_the_program_s_area_are_not_mapped(tmp_path):
    """A process's maps file of the run, there already (a process of the same pid
    before it), whose size is less than the area the program's code writes (its head
    right): the process maps none, and runs as the original. (Mapped, the code's
    writes past its end would go to whatever lies after it; a process that runs a
    program has an event ring in its region: this one none.) The process runs as pid
    1 of a pid namespace, so that its file's name is known before it starts."""
    import struct

    from urewrite.trampolines import program_file
    rewritten = build_arm64(tmp_path, VALUES, "values", ["-O2", "-pthread"],
                       lambda path: COUNTS.format(path=path))
    data = rewritten.read_bytes()
    at = data.rindex(struct.pack("<Q", program_file.MAGIC))  # (the runtime holds it too)
    header = program_file.HEADER.unpack_from(data, at)
    run, area, head_at, head_size = header[5], header[8], header[9], header[10]
    assert 0 < head_size <= 4096 < area
    directory = tmp_path / "dir"
    directory.mkdir()
    small = directory / (program_file.own_maps_name(run, os.getuid()) + ".1")
    small.write_bytes(data[at + head_at:at + head_at + head_size].ljust(4096, b"\0"))
    os.chmod(small, 0o600)
    as_pid_1 = ["unshare", "--pid", "--fork"]
    ran = check(as_pid_1 + emulate(rewritten) + ["300"], env={"UREWRITE_DIR": str(directory)})
    assert ran.stdout == check(emulate(tmp_path / "plain" / "values") + ["300"]).stdout
    assert small.stat().st_size == 4096
    fresh = tmp_path / "fresh"  # (where the process makes its maps, and runs the program)
    fresh.mkdir()
    check(as_pid_1 + emulate(rewritten) + ["300"], env={"UREWRITE_DIR": str(fresh)})
    (without,), (with_ring,) = directory.glob("*.ure"), fresh.glob("*.ure")
    assert without.stat().st_size < with_ring.stat().st_size
    assert (fresh / small.name).stat().st_size == area
