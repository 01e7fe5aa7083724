"""The public API (urewrite.api, docs/api.md): a sample rewritten, listed, run and
read through it, with the counts its source states; bad input raises UrewriteError
with the line the command line prints."""

import json
import os

import pytest

from conftest import urewrite
from live_server import programs  # noqa: F401 (the fixture: the server and its rewrites)
from urewrite import api

# samples/counts.c: entries per run, from its source
EXPECTED = {"square": 100, "fib": 1973, "add_one": 20, "twice": 20, "negate": 20,
            "apply": 60, "classify": 200, "is_even": 6, "is_odd": 5, "never_called": 0}


@pytest.fixture(scope="module")
def counts(builder):
    return builder.build("counts", ["counts.c"], ["-O2"]).path


@pytest.fixture(scope="module")
def rewritten(counts, tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "counts.probed"
    result = api.rewrite(str(counts), str(out), probes=list(EXPECTED), returns=["fib"])
    return result


def test_a_rewrite_reports_its_probes(rewritten):
    assert isinstance(rewritten, api.RewriteResult)
    entries = {p.name for p in rewritten.probes if p.kind == "entry"}
    assert entries == set(EXPECTED)
    assert {p.kind for p in rewritten.probes} == {"entry", "return"}
    assert rewritten.refusals == []
    assert rewritten.probe_count == len(EXPECTED) + 1  # (fib's exits count as one probe)
    assert sum(rewritten.tactics.values()) >= len(EXPECTED)


def test_a_command_run_counts_exactly(rewritten):
    ran = api.run([rewritten.output], latency=True)
    assert ran.exit_code == 3  # (counts.c exits with 3)
    for name, hits in EXPECTED.items():
        assert ran.counts.hits(name, "entry") == hits, name
    assert ran.counts.hits("fib", "return") == 1973
    measured = [p for p in ran.counts.probes if p.name == "fib" and p.histogram]
    assert sum(b.count for b in measured[0].histogram) == 1973  # (entry to return)
    assert ran.counts.processes == 1


def test_regions_read_from_a_directory(rewritten, tmp_path):
    env = dict(os.environ, UREWRITE_DIR=str(tmp_path))
    import subprocess
    assert subprocess.run([rewritten.output], env=env, capture_output=True).returncode == 3
    counts = api.read_regions(str(tmp_path))
    assert {name: counts.hits(name, "entry") for name in EXPECTED} == EXPECTED
    assert counts.problems == []


def test_list_sites_is_list_json(counts):
    listing = api.list_sites(str(counts))
    shown = json.loads(urewrite("list", "--json", "-q", str(counts)).stdout)
    assert [f.name for f in listing.functions] == [f["name"] for f in shown["functions"]]
    for typed, row in zip(listing.functions, shown["functions"]):
        as_row = {k: v for k, v in typed._asdict().items() if k != "return_probe"
                  and (v is not None or k in row)}
        assert {**as_row, "return": typed.return_probe._asdict()} == row


@pytest.mark.parametrize("call, args", [
    (lambda: api.rewrite("/nonexistent/app", "/nonexistent/out", probes=["main"]),
     ["/nonexistent/app", "-p", "main", "-o", "/nonexistent/out"]),
    (lambda: api.list_sites("/nonexistent/app"), ["list", "/nonexistent/app"]),
])
def test_bad_input_raises_the_line_the_command_line_prints(call, args):
    with pytest.raises(api.UrewriteError) as raised:
        call()
    proc = urewrite(*args)
    assert proc.returncode == 1
    assert proc.stderr == f"urewrite: {raised.value}\n"


def test_a_site_that_does_not_exist_is_the_same_error(counts, tmp_path):
    with pytest.raises(api.UrewriteError) as raised:
        api.rewrite(str(counts), str(tmp_path / "out"), probes=["no_such_function"])
    proc = urewrite(str(counts), "-p", "no_such_function", "-o", str(tmp_path / "out2"))
    assert proc.stderr == f"urewrite: {raised.value}\n"


def test_nothing_to_probe_and_bad_tactics(counts, tmp_path):
    with pytest.raises(api.NothingToProbe):
        api.rewrite(str(counts), str(tmp_path / "out"))
    with pytest.raises(api.UrewriteError, match="unknown tactic 'leap'"):
        api.rewrite(str(counts), str(tmp_path / "out"), probes=["fib"], tactics="jump,leap")
    with pytest.raises(api.UrewriteError):
        api.read_regions(str(tmp_path / "missing"))


def test_arm_counts_the_block_exactly(programs):
    """A running server (samples/live_server.c, as tests/test_live.py runs it) armed for
    a block: the requests made in it, and only those."""
    from live_server import Server
    server = Server(programs / "live_server.probed", programs / "probed-lib")
    try:
        server.work(3)  # (disarmed: not counted)
        with api.arm(server.pid) as armed:
            assert armed.pids == [server.pid]
            server.work(5)
        server.work(2)
        assert armed.counts.hits("handle_request", "entry") == 5
        assert armed.counts.hits("handle_request", "return") == 5
        assert server.stop() == 0
    finally:
        server.kill()
