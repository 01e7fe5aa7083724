"""Debian's node (99 MB, V8 inside) with every function probed at entry: JavaScript
programs run as under the original, disarmed and armed, and a few functions count
exactly what kernel uprobes count on the original. V8 copies its embedded builtins
at run time; probing them made node crash (issue #13), so they must be refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import function_symbols, urewrite

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(
    NODE is None or not os.path.realpath(NODE).startswith("/usr/bin/"),
    reason="needs Debian's node (package nodejs)")

# strings, JSON, regular expressions, promises, classes, a timer
SCRIPT = r"""
const s = "Hello, World! ".repeat(3).trim().split(" ").map(w => w.toUpperCase()).join("-");
console.log(s, s.length);
const o = JSON.parse(JSON.stringify({a: [1, 2, {b: "c"}], d: 1.5e3, e: null}));
console.log(JSON.stringify(o), Object.keys(o).length);
const re = /(\w+)@(\w+)\.com/g;
console.log([..."x@y.com, foo@bar.com, bad@, q@r.com".matchAll(re)].map(m => m[2]).join(","));
let sum = 0; for (let i = 0; i < 1e6; i++) sum += i % 7; console.log(sum);
new Promise(r => setTimeout(() => r(42), 20))
  .then(v => Promise.all([v, Promise.resolve(v * 2)])).then(vs => console.log("promises", vs));
class A { constructor(x) { this.x = x } get double() { return this.x * 2 } }
console.log(new A(21).double, [3, 1, 2].sort().reverse(), new Map([[1, "a"]]).get(1));
setTimeout(() => console.log("timer done"), 50);
"""
FAILING = r"""
try { JSON.parse("{bad") } catch (e) { console.log("caught", e.name) }
process.on("exit", code => console.log("exit", code));
setTimeout(() => { throw new RangeError("late") }, 10);
"""
# functions whose counts the script fixes (libuv's loop set-up and shut-down, main)
COUNTED = ("main", "uv_setup_args", "uv_loop_init", "uv_loop_close", "uv_timer_start",
           "uv_library_shutdown")


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    work = tmp_path_factory.mktemp("node")
    out = work / "node.all"
    proc = urewrite(NODE, "-p", "*", "-q", "--json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    (work / "script.js").write_text(SCRIPT)
    (work / "failing.js").write_text(FAILING)
    return work, json.loads(proc.stdout)


def _run(program, script: Path, env=None) -> tuple:
    proc = subprocess.run([str(program), str(script)], capture_output=True, timeout=120,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items()
                               if env and k in env or k != "UREWRITE_DIR"})
    return proc.returncode, proc.stdout, proc.stderr.replace(str(program).encode(), b"NODE")


def test_the_embedded_builtins_are_refused(rewritten):
    _, result = rewritten
    builtins = [r for r in result["refused"] if r["name"].startswith("Builtins_")]
    assert len(builtins) > 1000
    assert all("V8's embedded builtins" in r["reason"] for r in builtins)
    assert len(result["probes"]) > 50000


@pytest.mark.parametrize("script", ["script.js", "failing.js"])
def test_scripts_run_as_under_the_original(rewritten, script):
    work, _ = rewritten
    original = _run(NODE, work / script)
    assert original[0] == (0 if script == "script.js" else 1)
    assert _run(work / "node.all", work / script) == original
    regions = work / f"regions-{script}"
    regions.mkdir()
    assert _run(work / "node.all", work / script, {"UREWRITE_DIR": str(regions)}) == original
    assert any(regions.iterdir())


def test_counts_match_kernel_uprobes(rewritten, uprobes, tmp_path):
    work, _ = rewritten
    addresses = {name: address for name, address in function_symbols(NODE).items()
                 if name in COUNTED}
    assert set(addresses) == set(COUNTED)
    expected = uprobes.count(NODE, addresses, lambda: _run(NODE, work / "script.js"))
    report = tmp_path / "report.json"
    proc = urewrite("stat", "--json", "-o", str(report), "--", str(work / "node.all"),
                    str(work / "script.js"))
    assert proc.returncode == 0, proc.stderr
    hits = {p["name"]: p["hits"] for p in json.loads(report.read_text())["probes"]
            if p["name"] in COUNTED}
    assert hits == expected and all(expected.values()), (hits, expected)
