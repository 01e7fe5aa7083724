"""An entry whose code before its first call is shorter than a jump: a plain jump's
window would displace the call (emulated, its return mispredicted at every hit), so
the rewrite hops over it where a landing is free, and the call runs in place
(samples/call_prologue.c; docs/design.md, "Patch tactics")."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import rewrite, run, stat

WRAPPERS = ("wrap_one", "wrap_two", "keep_one", "keep_two")
# at -O2 and -O3 these start `sub rsp,8; call` or `push rbx; mov rbx,rdi; call`
# (keep_two computes its argument before the call: its jump displaces no call)
HOPPED = ("wrap_one", "wrap_two", "keep_one")


def _calls(n: int) -> dict:
    return {"wrap_one": n, "wrap_two": n // 2, "keep_one": n - (n + 2) // 3, "keep_two": n}


@pytest.fixture(params=[(level, link) for level in ("-O1", "-O2", "-O3")
                        for link in ("-pie", "-no-pie")],
                ids=lambda p: f"{p[0][1:]}{p[1]}")
def built(request, builder):
    level, link = request.param
    b = builder.build("call_prologue", ["call_prologue.c"],
                      [level, "-fcf-protection=none"], [link])
    b.level = level
    return b


def test_entries_before_a_call_are_hopped_and_count_exactly(built, tmp_path):
    out = tmp_path / "call_prologue.probed"
    result = rewrite(built.path, out, *WRAPPERS)
    tactics = {p["name"]: (p["tactic"], p["displaced"]) for p in result["probes"]}
    assert set(tactics) == set(WRAPPERS), result["refused"]
    if built.level != "-O1":  # (-O1 aligns no function: no padding to land in)
        for name in HOPPED:
            # the window ends before the call: `sub rsp,8` or `push rbx; mov rbx,rdi`
            assert tactics[name] == ("hop", 4), (name, tactics[name])
        assert tactics["keep_two"][0] == "jump"
    original = run([built.path, "1000"])
    st = stat([out, "1000"], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    hits = {p["name"]: p["hits"] for p in st.probes}
    assert hits == _calls(1000)
    assert run([out, "1000"]).stdout == original.stdout  # disarmed too


def test_without_hops_the_jump_displaces_the_call(built, tmp_path):
    out = tmp_path / "call_prologue.jumps"
    result = rewrite(built.path, out, *WRAPPERS, extra=["--tactics", "jump"])
    assert {p["tactic"] for p in result["probes"]} == {"jump"}
    assert all(p["displaced"] >= 8 for p in result["probes"] if p["name"] in HOPPED)
    original = run([built.path, "300"])
    st = stat([out, "300"], tmp_path)
    assert (st.proc.returncode, st.proc.stdout) == (0, original.stdout)
    assert {p["name"]: p["hits"] for p in st.probes} == _calls(300)
