"""`stat --interval`, `stat --dir` and `top`: counts read while processes run, exact.

The service sample runs until told to quit and answers each command once its
calls are made, so every count a test checks is known exactly at that moment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import cross
from conftest import SAMPLES, check, clean_env, urewrite
from live_service import (NAP_NS, PROBES, RETURNS, LineReader, Service, build_service,
                          region_bytes, stop_all, table, top_tables, wait_for)
from urewrite.reader.snapshots import percentile_ns
from urewrite.top import format_ns


@pytest.fixture(scope="module")
def service(builder):
    return build_service(builder)


def _stat_dir(directory, *extra):
    proc = urewrite("stat", "--dir", str(directory), "--duration", "0", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _hits(report, name, kind="entry", pid=None):
    return sum(p["hits"] for p in report["probes"] if p["name"] == name and p["kind"] == kind)


# -- stat --dir ------------------------------------------------------------------------

def test_stat_dir_reads_running_processes_then_exited_ones(service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    a, b = Service(service, regions), Service(service, regions)
    try:
        a.send("call 1000")
        b.send("call 300")
        b.send("nap 5")
        report = _stat_dir(regions)
        assert report["exit_code"] is None
        assert report["processes"] == 2
        assert _hits(report, "handle") == 1300
        assert _hits(report, "nap") == _hits(report, "nap", "return") == 5
        assert _hits(report, "fast") == 0
        (nap,) = [p for p in report["probes"] if p["kind"] == "return"]
        assert sum(b["count"] for b in nap["histogram"]) == 5
        assert all(b["hi_ns"] > NAP_NS for b in nap["histogram"])
        a.send("call 500")
        assert _hits(_stat_dir(regions), "handle") == 1800
        assert a.quit() == 0 and b.quit() == 0
    finally:
        stop_all(a, b)
    before = region_bytes(regions)
    text = urewrite("stat", "--dir", str(regions), "--duration", "0")
    assert text.returncode == 0, text.stderr
    rows = table(text.stdout.split("\n\n")[0].splitlines())
    assert sum(int(r["HITS"]) for r in rows if r["PROBE"] == "handle") == 1800
    assert {r["OBJECT"] for r in rows} == {"service.probed"}
    assert region_bytes(regions) == before, "stat --dir wrote into a region"


def test_stat_dir_errors(tmp_path):
    proc = urewrite("stat", "--dir", str(tmp_path / "missing"), "--duration", "0")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"urewrite: {tmp_path / 'missing'}: no such "
                                                f"directory"]
    empty = urewrite("stat", "--dir", str(tmp_path), "--duration", "0")
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no probe region in" in empty.stderr
    both = urewrite("stat", "--dir", str(tmp_path), "--", "true")
    assert both.returncode == 2 and "not both" in both.stderr
    neither = urewrite("stat")
    assert neither.returncode == 2
    lone = urewrite("stat", "--duration", "1", "--", "true")
    assert lone.returncode == 2 and "--duration goes with --dir" in lone.stderr
    # processes started with UREWRITE_DIR time calls as their own environment says
    for command in ("stat", "top", "export"):
        timed = urewrite(command, "--latency", "--dir", str(tmp_path), "--duration", "0",
                         *(["--listen", "127.0.0.1:0"] if command == "export" else []))
        assert timed.returncode == 2, timed.stderr
        assert "--latency goes with a command, -p or --all" in timed.stderr
        assert "UREWRITE_LATENCY=1" in timed.stderr and "Traceback" not in timed.stderr


def test_stat_dir_skips_a_file_that_is_not_a_region_and_waits_for_one_being_set_up(
        service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    (regions / "junk.1.ure").write_bytes(b"not a region".ljust(8192, b"x"))
    (regions / "setting-up.2.ure").write_bytes(b"\0" * 8192)  # sized, header not copied yet
    s = Service(service, regions)
    try:
        s.send("call 9")
        report = urewrite("stat", "--dir", str(regions), "--duration", "0", "--json")
        assert report.returncode == 0
        assert _hits(json.loads(report.stdout), "handle") == 9
        assert report.stderr.count("skipped") == 1 and "junk.1.ure" in report.stderr
        assert "setting-up" not in report.stderr
    finally:
        stop_all(s)


# -- stat --interval ---------------------------------------------------------------------

def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_interval_with_a_command_adds_up_to_the_exact_counts(service, tmp_path):
    report = tmp_path / "intervals.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "urewrite", "stat", "--interval", "0.1", "--json", "-o",
         str(report), "--", str(service)],
        input="call 1000\nspin 1\ncall 500\n", capture_output=True, text=True,
        env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    rounds = int(next(l for l in proc.stdout.splitlines() if l.startswith("rounds")).split()[1])
    *intervals, final = _json_lines(report.read_text())
    assert final["exit_code"] == 0
    expected = {"handle": 1500, "fast": 10 * rounds, "slow": rounds, "nap": 0}
    for p in final["probes"]:
        assert p["hits"] == expected[p["name"]], p
    assert len(intervals) >= 5  # a second of spinning, at 0.1 s
    previous = {}
    for interval in intervals:
        assert interval["seconds"] > 0
        for p in interval["probes"]:
            key = (p["name"], p["kind"])
            assert p["total"] == previous.get(key, 0) + p["hits"]  # nothing lost, nothing twice
            assert p["per_second"] == pytest.approx(p["hits"] / interval["seconds"], rel=1e-4, abs=0.01)
            previous[key] = p["total"]
    assert {k[0]: v for k, v in previous.items() if k[1] == "entry"} == expected
    # while it spun, handle stood at exactly 1000 and fast and slow moved
    spinning = [i for i in intervals
                if any(p["name"] == "fast" and p["hits"] for p in i["probes"])]
    assert spinning and all(
        p["total"] == 1000 for i in spinning[:-1] for p in i["probes"] if p["name"] == "handle")


def test_interval_table_to_stdout_after_the_program_output(service):
    proc = subprocess.run([sys.executable, "-m", "urewrite", "stat", "--interval", "0.2", "--",
                           str(service)], input="call 7\n", capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "ok call 7"
    header = out.index(next(l for l in out if l.startswith("#")))
    assert out[header].split() == ["#", "TIME(s)", "OBJECT", "PROBE", "KIND", "HITS", "HITS/S"]
    report = out.index(next(l for l in out if l.startswith("OBJECT")))
    interval_rows = [l.split() for l in out[header + 1:report]]
    assert sum(int(r[4]) for r in interval_rows if r[2] == "handle") == 7
    assert [l.split()[4] for l in out[report + 1:] if l.split()[1] == "handle"] == ["7"]


def test_interval_on_a_directory_sees_processes_come_and_go_and_stops_on_ctrl_c(
        service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    old = Service(service, regions)
    old.send("call 100")
    assert old.quit() == 0  # an exited process's region: counted in totals, not in intervals
    watcher = subprocess.Popen([sys.executable, "-m", "urewrite", "stat", "--dir", str(regions),
                                "--interval", "0.1", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=clean_env())
    s = None
    try:
        lines = LineReader(watcher.stdout)

        def next_interval():
            return json.loads(lines.next_line(60))

        def handle_total(interval):
            return sum(p["total"] for p in interval["probes"] if p["name"] == "handle")

        seen = [next_interval()]
        assert handle_total(seen[0]) == 100
        s = Service(service, regions)
        s.send("call 1000")
        while handle_total(seen[-1]) != 1100:  # read while it runs
            seen.append(next_interval())
            assert handle_total(seen[-1]) <= 1100
        s.send("call 1")
        assert s.quit() == 0
        while handle_total(seen[-1]) != 1101:
            seen.append(next_interval())
        watcher.send_signal(signal.SIGINT)
        watcher.wait(timeout=60)
        out, err = lines.rest(), watcher.stderr.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
        stop_all(*(x for x in (s,) if x))
    assert watcher.returncode == 0, err
    *rest, final = _json_lines(out)
    seen += rest
    assert sum(p["hits"] for i in seen for p in i["probes"] if p["name"] == "handle") == 1001
    assert _hits(final, "handle") == 1101
    assert final["processes"] == 2


# -- top -----------------------------------------------------------------------------------

def test_top_plain_sorts_by_rate_with_exact_totals(service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(service, regions)
    try:
        s.send("call 1234")
        s.start("spin 4")
        time.sleep(0.3)
        proc = urewrite("top", "--dir", str(regions), "--interval", "0.5", "-n", "2")
        lines = s.answer("spin 4")
        rounds = int(lines[0].split()[1])
        final = _stat_dir(regions)
    finally:
        stop_all(s)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout  # plain when stdout is not a terminal
    tables = top_tables(proc.stdout)
    assert len(tables) == 2
    for title, rows in tables:
        assert title.startswith(f"urewrite top - {regions} - 1 process, 5 probes - every 0.5 s")
        assert "untimed" not in title  # (started with UREWRITE_LATENCY=1)
        assert [r["PROBE"] for r in rows[:2]] == ["fast", "slow"]
        rate = {(r["PROBE"], r["KIND"]): float(r["HITS/S"]) for r in rows}
        assert rate["fast", "entry"] == pytest.approx(10 * rate["slow", "entry"], abs=60)
        assert rate["slow", "entry"] > 0 and rate["handle", "entry"] == 0
        total = {(r["PROBE"], r["KIND"]): int(r["TOTAL"]) for r in rows}
        assert total["handle", "entry"] == 1234 and total["nap", "return"] == 0
        assert {r["P50"] for r in rows} == {"-"}
    assert _hits(final, "fast") == 10 * rounds and _hits(final, "slow") == rounds


def test_top_latency_percentiles(service, tmp_path):
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(service, regions)
    try:
        s.start("nap 400")  # 3 ms each: 1.2 s and more
        time.sleep(0.2)
        proc = urewrite("top", "--dir", str(regions), "--interval", "0.5", "--once")
        s.answer("nap 400")
    finally:
        stop_all(s)
    assert proc.returncode == 0, proc.stderr
    ((_, rows),) = top_tables(proc.stdout)
    nap = {r["KIND"]: r for r in rows if r["PROBE"] == "nap"}
    assert nap["entry"]["P50"] == "-"  # only the return probe has the histogram
    # 3 ms lies in [2^21, 2^22) ns: below 4.19 ms
    assert nap["return"]["P50"] == "<4.19ms"
    # a loaded machine oversleeps some naps; P99 is then a higher bucket, never a lower one
    assert nap["return"]["P99"] in ("<4.19ms", "<8.39ms", "<16.8ms", "<33.6ms", "<67.1ms",
                                    "<134ms", "<268ms", "<537ms", "<1.07s")
    assert rows[0]["PROBE"] == "nap"


def test_top_with_a_command_shows_its_last_counts_and_passes_its_status(service):
    proc = subprocess.run([sys.executable, "-m", "urewrite", "top", "--interval", "0.2", "--",
                           str(service)], input="call 42\nnap 2\n", capture_output=True,
                          text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace("ok call 42\n", "").replace("ok nap 2\n", "")
    title, rows = top_tables(text)[-1]
    total = {(r["PROBE"], r["KIND"]): int(r["TOTAL"]) for r in rows}
    assert total == {("handle", "entry"): 42, ("fast", "entry"): 0, ("slow", "entry"): 0,
                     ("nap", "entry"): 2, ("nap", "return"): 2}
    failing = urewrite("top", "--once", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7
    missing = urewrite("top", "--once", "--", "/nonexistent/program")
    assert missing.returncode == 127 and "cannot run" in missing.stderr


def test_percentiles_and_their_format():
    buckets = [0] * 64
    assert percentile_ns(buckets, 0.5) is None and percentile_ns(None, 0.5) is None
    buckets[3] = 50  # [4, 8) ns
    buckets[10] = 49  # [512, 1024) ns
    buckets[20] = 1
    assert percentile_ns(buckets, 0.5) == 8
    assert percentile_ns(buckets, 0.51) == 1024
    assert percentile_ns(buckets, 0.99) == 1024  # the 99th of 100 samples
    assert percentile_ns(buckets, 1.0) == 1 << 20
    assert [format_ns(n) for n in (None, 8, 1024, 1 << 22, 3 * 10 ** 9)] == \
        ["-", "<8ns", "<1.02us", "<4.19ms", "<3s"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_full_screen_in_a_terminal_quits_on_q(service, tmp_path):
    """In a real terminal (tmux): the table drawn in place, `q` quits with status 0 and
    gives the terminal back."""
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(service, regions)
    session = f"urewrite-top-{os.getpid()}"
    done = tmp_path / "done"
    command = (f"{sys.executable} -m urewrite top --dir {regions} -d 0.3; "
               f"echo $? > {done}; sleep 60")
    tmux = ["tmux", "-L", session]
    try:
        s.send("call 5")
        s.start("spin 30")
        subprocess.run(tmux + ["new-session", "-d", "-s", session, "-x", "100", "-y", "12",
                               command], check=True, env=clean_env())

        def screen():
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", session],
                                  capture_output=True, text=True).stdout

        def drawn():
            text = screen()
            rows = [l.split() for l in text.splitlines() if l.strip()]
            return len(rows) >= 3 and rows[1][0] == "PROBE" and rows[2][0] == "fast" \
                and rows[2][3] != "-" and float(rows[2][3]) > 0 and text
        text = wait_for(drawn, timeout=60, step=0.2)
        title = f"urewrite top - {regions} - 1 process"
        # cut at 100 columns (a long temporary path), and the cut line without its trailing
        # blanks (capture-pane drops them: a cut right after a space left one unmatched)
        assert text.startswith(title[:100].rstrip())
        assert "handle  service.probed  entry" in text
        subprocess.run(tmux + ["send-keys", "-t", session, "q"], check=True)
        wait_for(done.exists, timeout=30)
        assert done.read_text().strip() == "0"
        assert "PROBE" not in screen()  # the alternate screen is gone
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
        stop_all(s)


@cross.needs(cross.CC, cross.QEMU)
def test_stat_dir_and_top_read_an_arm64_process(tmp_path):
    """The same region layout from an AArch64 process under qemu, read while it runs."""
    original, probed = tmp_path / "service", tmp_path / "service-a64.probed"
    check([cross.CC, "-O2", SAMPLES / "service.c", "-o", original])
    args = [a for p in PROBES for a in ("-p", p)] + [a for r in RETURNS for a in ("-r", r)]
    assert urewrite(str(original), *args, "-o", str(probed), "-q").returncode == 0
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(probed, regions, command=cross.emulate(probed))
    try:
        s.send("call 1000")
        s.send("nap 12")
        report = _stat_dir(regions)
        assert (_hits(report, "handle"), _hits(report, "nap", "return")) == (1000, 12)
        s.send("call 5")
        top = urewrite("top", "--dir", str(regions), "--once", "-d", "0.2")
        ((_, rows),) = top_tables(top.stdout)
        assert {(r["PROBE"], r["KIND"]): int(r["TOTAL"]) for r in rows}[("handle", "entry")] \
            == 1005
        assert s.quit() == 0
    finally:
        stop_all(s)


def test_top_shows_the_maps_of_a_built_in_program(service, tmp_path):
    """Under the table, the maps of a program built into the probes (urewrite IN -e
    PROGRAM), as `urewrite run` prints them, at each refresh."""
    built = tmp_path / "service.built"
    proc = urewrite(str(service.parent / "service"), "-e", "uprobe:service:handle "
                    "{ @n = count(); @odd[arg0 % 2] = count(); }", "-o", str(built), "-q")
    assert proc.returncode == 0, proc.stderr
    regions = tmp_path / "regions"
    regions.mkdir()
    s = Service(built, regions)
    try:
        s.send("call 301")
        proc = urewrite("top", "--dir", str(regions), "--interval", "0.2", "-n", "1")
    finally:
        stop_all(s)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("the program built into the probes:\n\n"
                                "@n: 301\n@odd[1]: 150\n@odd[0]: 151\n"), proc.stdout


def test_top_shows_the_maps_of_a_program_run_loaded(service, tmp_path):
    """Under the table, the maps of a program `urewrite run --dir` loaded, as they are
    at each refresh; when the run ends, it prints the same."""
    from live_service import ProgramLoader, with_arguments
    built = with_arguments(service, tmp_path)
    regions = tmp_path / "regions"
    regions.mkdir()
    loader = ProgramLoader(f"uprobe:{built}:handle {{ @n = count(); @odd[arg0 % 2] = count(); }}",
                           regions)
    s = None
    try:
        s = Service(built, regions)
        s.send("call 301")
        proc = urewrite("top", "--dir", str(regions), "--interval", "0.2", "-n", "1")
        assert s.quit() == 0
        out = loader.stop()
    finally:
        loader.kill()
        if s is not None:
            stop_all(s)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("the program urewrite run loaded:\n\n"
                                "@n: 301\n@odd[1]: 150\n@odd[0]: 151\n"), proc.stdout
    assert "@n: 301" in out
