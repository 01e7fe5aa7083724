"""Every function of the system's python3 binary probed at entry and return: it must
run as the original, and every function must return as many times as it was entered.

Debian's python3.11 is stripped and split by its compiler: some 3,000 of its 10,221
FDEs are parts running inside another function's frame. Probing it whole is how
the planner learnt to follow such parts and never redirect a return address there."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import run

from urewrite.rewriter import usdt
from urewrite.rewriter.elf_file import ElfFile

PYTHON = "/usr/bin/python3.11"
pytestmark = pytest.mark.skipif(not os.path.exists(PYTHON), reason="needs Debian's python3.11")

WORK = textwrap.dedent("""\
    import asyncio, collections, decimal, json, re, sqlite3, threading
    def job(n):
        return sum(len(json.dumps(list(range(i)))) for i in range(n))
    out = []
    ts = [threading.Thread(target=lambda k=k: out.append(job(60 + k))) for k in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(sorted(out))
    print(re.sub(r"(\\d+)", lambda m: str(int(m.group(1)) * 2), "a1 b22 c333"))
    print(decimal.Decimal(1) / decimal.Decimal(7))
    db = sqlite3.connect(":memory:"); db.execute("create table t(x)")
    db.executemany("insert into t values (?)", [(i,) for i in range(500)])
    print(db.execute("select sum(x) from t").fetchone())
    try:
        {}["missing"]
    except KeyError as e:
        print("caught", e)
    def rec(n): return 0 if n == 0 else 1 + rec(n - 1)
    print(rec(500), collections.Counter("abracadabra").most_common(2))
    async def main(): return sum([await asyncio.sleep(0, i) for i in range(100)])
    print(asyncio.run(main()))
    """)


def urewrite(*args):
    return run([sys.executable, "-m", "urewrite", *args])


def test_every_function_returns_as_often_as_it_is_entered(tmp_path):
    script = tmp_path / "work.py"
    script.write_text(WORK)
    probed = tmp_path / "python3.probed"
    out = urewrite(PYTHON, "-p", "*", "-r", "*", "-q", "-o", probed)
    assert out.returncode == 0, out.stderr
    listed = json.loads(urewrite("list", "--json", PYTHON).stdout)["functions"]
    mechanisms = {f["return"]["mechanism"] for f in listed if f["return"]}
    assert {"exit sites", "redirection"} <= mechanisms

    original = subprocess.run([PYTHON, script], capture_output=True, text=True)
    assert original.returncode == 0, original.stderr
    disarmed = subprocess.run([probed, script], capture_output=True, text=True)
    assert (disarmed.returncode, disarmed.stdout) == (0, original.stdout)
    run = urewrite("stat", "--json", "--", probed, script)
    start = run.stdout.index('{\n  "exit_code"')
    assert run.stdout[:start] == original.stdout
    assert "missed" not in run.stderr
    entries, returns = {}, {}
    for p in json.loads(run.stdout[start:])["probes"]:
        (entries if p["kind"] == "entry" else returns)[p["name"]] = p["hits"]
    assert sum(returns.values()) > 100_000
    unequal = {name: (entries[name], hits) for name, hits in returns.items()
               if name in entries and entries[name] != hits}
    assert unequal == {"_start": (1, 0)}  # the one frame that never returns


LOOP = "import sys\nfor i in range(int(sys.argv[1])):\n    x = i * 2\n"


def test_every_usdt_site_and_python_line_counts_as_uprobes_do(tmp_path, uprobes):
    """All of python's USDT sites take a probe (python:line is a 1-byte nop before a
    jmp, next to a data word that only looks like an address inside it). The line
    events that 1,000 more loop iterations add are the same under urewrite as under
    a kernel uprobe with the probe's semaphore: startup, which depends on where the
    binary lies, cancels out."""
    probed = tmp_path / "python3.probed"
    result = json.loads(urewrite(PYTHON, "-p", "usdt:python:*", "--json", "-o", probed).stdout)
    assert result["refused"] == []
    sites = {p["name"] for p in result["probes"]}
    assert "python:line" in sites and len(sites) >= 8
    line = next(u for u in usdt.discover(ElfFile.open(PYTHON)) if u.probe == "python:line")
    assert line.semaphore and any(p["address"] == line.pc for p in result["probes"])
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    # the kernel's probe on a copy: a uprobe counts every process that runs its file, and
    # other tests' processes (pytest-xdist's workers, where python3 is this one) run
    # the system's
    plain = tmp_path / "python3.plain"
    shutil.copy2(PYTHON, plain)

    def kernel(n: int) -> int:
        return uprobes.count(plain, {"line": line.pc},
                             lambda: subprocess.run([plain, script, str(n)], check=True),
                             semaphores={"line": line.semaphore})["line"]

    def ours(n: int) -> int:
        run = urewrite("stat", "--json", "-o", tmp_path / f"r{n}.json", "--", probed, script, n)
        assert run.returncode == 0, run.stderr
        report = json.loads((tmp_path / f"r{n}.json").read_text())
        return sum(p["hits"] for p in report["probes"] if p["name"] == "python:line")

    added = kernel(1100) - kernel(100)
    assert added >= 2000  # two lines an iteration
    assert ours(1100) - ours(100) == added
