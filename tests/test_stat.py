"""`urewrite stat`: exit status, signals, missing commands, where the report goes, its schema."""

from __future__ import annotations

import json
import os
import re
import stat as stat_module

import pytest

from conftest import ENV_VAR, rewrite, run, running, stat, urewrite
from variants import COUNTS_EXPECTED
from urewrite.trampolines import region as region_layout


@pytest.fixture(scope="module")
def counts(builder):
    """counts.c at -O2 (PIE), its rewritten copy with every function probed, its output."""
    built = builder.build("counts", ["counts.c"], ["-O2"], [], subdir="stat-counts")
    probed = built.dir / "counts.probed"
    rewrite(built.path, probed, "*")
    original = run([built.path])
    assert original.returncode == 3
    return built, probed, original


@pytest.fixture(scope="module")
def signals(builder):
    built = builder.build("signals", ["signals.c"], ["-O2"], [], subdir="stat-signals")
    probed = built.dir / "signals.probed"
    rewrite(built.path, probed, "*")
    return built, probed


def _table(text: str):
    """Rows of a stat table: dicts keyed by the header's column names."""
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:5] == ["OBJECT", "PROBE", "KIND", "ADDRESS", "HITS"]
    return [dict(zip(header, line.split())) for line in lines[1:]]


def test_table_follows_program_output_and_exit_status_passes_through(counts):
    built, probed, original = counts
    proc = urewrite("stat", "--", str(probed))
    assert proc.returncode == 3
    assert proc.stdout.startswith(original.stdout)
    rows = {r["PROBE"]: r for r in _table(proc.stdout[len(original.stdout):])}
    for name, hits in COUNTS_EXPECTED.items():
        assert rows[name]["OBJECT"] == "counts.probed"
        assert rows[name]["KIND"] == "entry"
        assert int(rows[name]["HITS"]) == hits, name
        assert re.fullmatch(r"0x[0-9a-f]{16}", rows[name]["ADDRESS"])
    assert proc.stderr == original.stderr


def test_report_to_a_file_leaves_stdout_alone(counts, tmp_path):
    built, probed, original = counts
    report = tmp_path / "report.txt"
    proc = urewrite("stat", "-o", str(report), "--", str(probed))
    assert proc.returncode == 3
    assert proc.stdout == original.stdout
    rows = {r["PROBE"]: int(r["HITS"]) for r in _table(report.read_text())}
    assert rows["fib"] == 1973


def test_json_report_to_a_file(counts, tmp_path):
    built, probed, original = counts
    report = tmp_path / "report.json"
    proc = urewrite("stat", "--json", "-o", str(report), "--", str(probed))
    assert proc.returncode == 3
    assert proc.stdout == original.stdout
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3


def test_json_schema(counts, tmp_path):
    built, probed, original = counts
    st = stat([probed], tmp_path)
    data = st.report
    assert {"exit_code", "processes", "probes"} <= set(data)
    assert data["exit_code"] == 3 and data["processes"] == 1
    assert isinstance(data["probes"], list) and data["probes"]
    for p in data["probes"]:
        assert {"object", "name", "kind", "address", "hits"} <= set(p)
        assert isinstance(p["object"], str) and isinstance(p["name"], str)
        assert p["kind"] in ("entry", "address")
        assert isinstance(p["address"], int) and isinstance(p["hits"], int) and p["hits"] >= 0
    names = [p["name"] for p in data["probes"]]
    assert len(names) == len(set(names))
    syms = {n: a for n, a in built.own_functions.items()}
    for p in data["probes"]:
        if p["name"] in syms:
            assert p["address"] == syms[p["name"]]


def test_signal_exit_status(signals, tmp_path):
    built, probed = signals
    original = run([built.path])
    assert original.returncode == -15  # SIGTERM
    st = stat([probed], tmp_path)
    assert st.proc.returncode == 143
    assert st.report["exit_code"] == 143
    assert st.proc.stdout == original.stdout == "sum=18 handled=5\n"
    # hits before the signal, and from a signal handler, are counted
    assert st.hits("before_signal") == 4
    assert st.hits("on_usr1") == 5
    assert st.hits("in_handler") == 5
    assert st.hits("main") == 1


def test_signal_exit_status_of_an_unprobed_program(signals):
    built, _ = signals
    proc = urewrite("stat", "--", str(built.path))
    assert proc.returncode == 143
    assert "urewrite: no probe" in proc.stderr


@pytest.mark.parametrize("command", ["/nonexistent/program", "urewrite-no-such-command-here"])
def test_command_not_found(command, tmp_path):
    report = tmp_path / "r"
    proc = urewrite("stat", "-o", str(report), "--", command, "arg")
    assert proc.returncode == 127
    assert proc.stdout == ""
    assert proc.stderr.startswith("urewrite: ") and proc.stderr.count("\n") == 1
    assert command in proc.stderr
    assert "Traceback" not in proc.stderr


def test_command_not_executable(counts, tmp_path):
    built, probed, _ = counts
    copy = tmp_path / "noexec"
    copy.write_bytes(probed.read_bytes())
    os.chmod(copy, stat_module.S_IRUSR | stat_module.S_IWUSR)
    proc = urewrite("stat", "--", str(copy))
    assert proc.returncode == 127
    assert "Traceback" not in proc.stderr


def test_unprobed_command(counts, tmp_path):
    built, _, original = counts
    st = stat([built.path], tmp_path)
    assert st.proc.returncode == 3
    assert st.proc.stdout == original.stdout
    assert (st.report["exit_code"], st.report["processes"], st.report["probes"]) == (3, 0, [])
    assert "urewrite: no probe" in st.proc.stderr


def test_options_after_the_command_belong_to_it(tmp_path):
    proc = urewrite("stat", "--json", "--", "sh", "-c", "echo -o --json; exit 7")
    assert proc.returncode == 7
    assert proc.stdout.startswith("-o --json\n")
    assert json.loads(proc.stdout[len("-o --json\n"):])["exit_code"] == 7


def test_shell_script_running_a_probed_program_twice(counts, tmp_path):
    built, probed, original = counts
    script = f"'{probed}' > /dev/null; '{probed}'"
    st = stat(["sh", "-c", script], tmp_path)
    assert st.proc.returncode == 3
    assert st.proc.stdout == original.stdout
    assert st.report["processes"] == 2
    assert st.hits("fib") == 2 * 1973
    assert st.hits("main") == 2


@pytest.mark.parametrize("value", ["", "/nonexistent/urewrite-dir", "relative-dir"])
def test_unusable_region_directory_leaves_probes_disarmed(counts, tmp_path, value):
    built, probed, original = counts
    proc = run([probed], env={ENV_VAR: value}, cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stdout == original.stdout
    assert proc.stderr == original.stderr
    assert os.listdir(tmp_path) == []


def test_region_files_when_the_variable_is_set_by_hand(counts, tmp_path):
    built, probed, original = counts
    proc = run([probed], env={ENV_VAR: str(tmp_path)})
    assert proc.returncode == 3 and proc.stdout == original.stdout
    files = os.listdir(tmp_path)
    assert len(files) == 1 and "counts.probed" in files[0] and files[0].endswith(".ure")
    from urewrite.trampolines.region import read_regions
    (region,) = read_regions(str(tmp_path))
    assert region.object == "counts.probed"
    hits = {p.name: p.hits for p in region.probes}
    assert hits["fib"] == 1973 and hits["main"] == 1


def test_disarmed_run_writes_nothing(counts, tmp_path):
    built, probed, original = counts
    proc = run([probed], cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, original.stdout, original.stderr)
    assert os.listdir(tmp_path) == []


def test_stat_requires_a_command():
    proc = urewrite("stat")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs a writable /dev/shm")
def test_regions_go_to_tmpfs_where_there_is_one(counts, tmp_path):
    # a region on a disk file system is written back and faults again on the hit path
    script = tmp_path / "where.sh"
    _, probed, _ = counts
    script.write_text(f'#!/bin/sh\necho "$UREWRITE_DIR"\nexec {probed}\n')
    script.chmod(0o755)
    result = stat([script], tmp_path)
    assert result.proc.returncode == 3
    directory = result.proc.stdout.splitlines()[0]
    assert directory.startswith("/dev/shm/urewrite-"), directory
    assert not os.path.exists(directory)  # removed afterwards


@pytest.mark.parametrize("args", [
    ["--", "ls", "-l"], ["-o", "f", "--", "ls"], ["--json", "-o", "f", "--", "a", "--", "b"],
    ["--output=f", "--json", "--", "x"], ["--output", "f", "--", "x"], ["--", "--json"],
    ["-o", "f", "-o", "g", "--", "x"], ["ls"], ["--"], ["-o", "--", "--", "x"],
    ["--interval", "1", "--", "x"], ["-p", "1"], ["--js", "--", "x"], ["-ofile", "--", "x"],
    ["--output=", "--", "x"], ["--dir", "d", "--", "x"], ["--all", "--", "x"],
    ["--latency", "--", "x"], ["--json", "--latency", "-o", "f", "--", "x"],
    ["--latency", "--dir", "d", "--", "x"],
])
def test_a_command_started_early_is_the_one_the_command_line_runs(args):
    """`stat ... -- COMMAND` runs and reports without click (urewrite/entry.py): only
    for a command line that click parses into running that very COMMAND, with the
    same --json, -o and --latency."""
    import click
    from urewrite.commands import stat as stat_command
    from urewrite.entry import stat_command as early
    started = early(["stat", *args])
    if started is None:
        return
    params = stat_command.make_context("stat", list(args)).params
    assert (params["interval"], params["directory"], params["pids"], params["all_of"],
            params["duration"]) == (None,) * 5
    assert (list(params["command"]), params["as_json"], params["output"],
            params["latency"]) == tuple(started)
    assert isinstance(stat_command, click.Command)


def test_ctrl_c_while_the_command_starts_goes_to_the_command(tmp_path):
    """Ctrl-C reaches the command, and stat waits for it and reports, also while stat is
    still loading (the command was started first)."""
    import signal
    import subprocess
    import sys
    report = tmp_path / "report.json"
    with running([sys.executable, "-m", "urewrite", "stat", "--json", "-o",
                  str(report), "--", "sh", "-c", "echo ready; exec sleep 30"],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 start_new_session=True) as proc:
        assert proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGINT)  # (the terminal sends it to the whole group)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err
    assert json.loads(report.read_text())["exit_code"] == 128 + signal.SIGINT


def test_stat_arms_with_the_variable_the_runtime_reads():
    from urewrite.reader import command_run
    assert command_run.ENV_VAR == ENV_VAR == region_layout.ENV_VAR
    assert command_run.LATENCY_ENV_VAR == region_layout.LATENCY_ENV_VAR


def test_a_closed_stdout_ends_stat_quietly(counts):
    """A reader of the report that goes away (`| head -1`) ends stat with status 1 and no
    traceback, as click's commands end."""
    import subprocess
    import sys
    _, probed, _ = counts
    proc = subprocess.Popen([sys.executable, "-m", "urewrite", "stat", "--", "sh", "-c",
                             f"sleep 0.5; exec '{probed}' > /dev/null"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1
    assert "Traceback" not in err and "Error" not in err, err


def test_rows_made_while_the_command_runs_are_the_report_made_after(counts, tmp_path):
    """stat -- COMMAND formats its table's rows while the command runs (the probe
    tables it reads then, PreparedRows): the same text as the report made from the
    counts alone; with histograms (--latency) the report is made after, as before."""
    from urewrite.reader.command_run import run_and_collect
    from urewrite.stat_report import PreparedRows, report
    from urewrite.trampolines.region_reader import TableCache, collect
    built, _, original = counts
    both = built.dir / "counts.both.probed"
    rewrite(built.path, both, "*", extra=["-r", "*"])
    for latency in (False, True):
        directory = tmp_path / f"latency-{latency}"
        directory.mkdir()
        env = {ENV_VAR: str(directory), **({"UREWRITE_LATENCY": "1"} if latency else {})}
        for _ in range(2):
            assert run([both], env=env).returncode == 3
        tables = TableCache()
        regions = collect(str(directory), [], tables)
        prepared = PreparedRows()
        for obj, table in tables.parsed:
            prepared(obj, table)
        assert len(prepared.by_table) == 1
        assert (prepared.table_lines(regions) is None) == latency
        expected = report(0, regions, False)
        assert report(0, regions, False, (), prepared) == expected
        # the probes left to be made: by the prepared rows, or made for the report
        for rows in (prepared, PreparedRows()):
            later = collect(str(directory), [], tables, probes_later=True)
            assert any(r.hits is not None for r in later) != latency
            assert report(0, later, False, (), rows) == expected
    # run_and_collect tells of each table while the command runs
    seen = []
    code, regions, _, _ = run_and_collect(["sh", "-c", f"'{both}' >/dev/null; sleep 0.3"],
                                          on_table=lambda obj, table: seen.append(obj))
    assert code == 0 and seen == ["counts.both.probed"]


def test_prepared_rows_add_up_probes_of_one_key():
    """Probes with the same object, name, kind and address are one row, as
    probe_totals makes them."""
    from urewrite.reader.counts import TableRows
    from urewrite.trampolines.region import ProbeCount
    from urewrite.trampolines.region_reader import ProbeTable
    table = ProbeTable(("f", "g", "f", "f"), ("entry", "entry", "entry", "return"),
                       (16, 32, 16, 16), (-1, -1, -1, -1))
    rows = TableRows("a.out", table)
    assert rows.keys == [("a.out", "f", "entry", 16), ("a.out", "g", "entry", 32),
                         ("a.out", "f", "return", 16)]
    probes = [ProbeCount(n, k, a, h) for n, k, a, h in zip(table.names, table.kinds,
                                                           table.addresses, (1, 2, 4, 8))]
    assert rows.totals([p.hits for p in probes]) == [5, 2, 8]
    assert rows.without_histograms(probes)


def test_the_command_gets_default_signal_dispositions():
    """Python ignores SIGPIPE and SIGXFSZ, and stat ignores SIGINT while the command
    runs: the command gets them default, as a shell would give them (`yes | head`
    ends quietly)."""
    import signal
    proc = urewrite("stat", "--json", "--", "sh", "-c", "grep SigIgn /proc/$$/status")
    ignored = int(proc.stdout.split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & 1 << (sig - 1), sig
    proc = urewrite("stat", "--json", "--", "sh", "-c", "yes | head -1")
    assert proc.stdout.startswith("y\n") and "Broken pipe" not in proc.stderr
