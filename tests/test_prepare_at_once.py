"""What prepare() learns of every function at once from the sweeps' arrays, so as not to
ask each function (a big file has 100,000 of them), is what asking each one gives: the
functions none of whose branches lands on a fragment (_parts() skips their branch
targets) and those with no indirect jump (no jump table to look for)."""

import os

import pytest

from urewrite.rewriter import pipeline

FILES = ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/python3.11",
         "/lib/x86_64-linux-gnu/libc.so.6"]


def prepared(path: str):
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    a = pipeline.analyse(path)
    a.planner.prepare(a.functions)
    return a


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_parts_found_with_arrays_are_found_without(path):
    """Every function's parts are the same when asked without the arrays, the functions
    skipped do branch to no fragment (a part split off by the compiler, entered by a
    jump), and most are skipped."""
    a = prepared(path)
    planner = a.planner
    clear, fragments = planner.model.no_fragment_targets, planner.model.fragments()
    with_arrays = {fn.address: planner.model.parts(fn) for fn in a.functions if fn.size}
    asked = pipeline.analyse(path)  # (not prepared: each function's parts asked of it)
    assert not asked.planner.model.no_fragment_targets
    for fn in asked.functions:
        if fn.size:
            assert asked.planner.model.parts(fn) == with_arrays[fn.address], fn.name
    for fn in a.functions:
        if fn.address in clear:
            assert planner.model.branch_targets(fn).keys().isdisjoint(fragments.keys()), fn.name
    assert len(clear) > len(a.functions) // 2
    # (and some functions have fragments among their parts: found without the names)
    assert any(f.address in fragments for parts in with_arrays.values() for f in parts[1:])


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_functions_without_indirect_jumps_found_with_arrays(path):
    """The functions said to have no indirect jump have none in their sweeps, and every
    function's jump tables are the same when each is asked in full; most are said so,
    and some others do have tables."""
    a = prepared(path)
    planner = a.planner
    plain = planner.model.no_indirect_jumps
    at_once = {fn.address: (planner.model.jump_tables(fn), planner.model.unknown_jumps[fn.address])
               for fn in a.functions}
    planner.model.tables.clear()
    planner.model.unknown_jumps.clear()
    planner.model.no_indirect_jumps = set()
    for fn in a.functions:
        if fn.address in plain:
            assert planner.model.indirect_jumps(fn) == [], fn.name
        assert (planner.model.jump_tables(fn), planner.model.unknown_jumps[fn.address]) == \
            at_once[fn.address], fn.name
    assert len(plain) > len(a.functions) // 2
    assert any(tables for tables, _ in at_once.values())
