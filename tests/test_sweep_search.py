"""The compiled searches over the sweeps (rewriter/sweep_search.py) give what the
Python planner gives: the windows of every entry and exit of every function of system
files and of samples built at several levels, and of sites at every instruction of
them, asked one by one and all at once; the rows that may leave each function. They
must also answer for most of them (else they would not be worth having), and leave to
the Python code what they cannot know."""

import os
import subprocess

import pytest

from urewrite.arch.base import BRANCH, JUMP, OTHER, RETURN
from urewrite.arch.x86_64 import linear_sweep
from urewrite.rewriter import pipeline
from urewrite.rewriter.plan.results import Refused
from urewrite.rewriter.selectors import Site
from urewrite.trampolines.region import KIND_ADDRESS, KIND_ENTRY, KIND_RETURN

pytestmark = pytest.mark.skipif(
    linear_sweep.sweep_search_engine is None,
    reason="the native module was not built (no Rust toolchain at install time)")

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
SYSTEM_FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                "/usr/bin/python3.11"]


def prepared(path: str):
    """The planner of a file, every function analysed as `list` does."""
    a = pipeline.analyse(path)
    a.planner.prepare(a.functions)
    assert a.planner.model.compiled_search() is not None
    return a


def described(plan) -> tuple:
    return (plan.window.address, plan.window.size,
            [(i.address, i.size, i.mnemonic, i.op_str) for i in plan.window.insns],
            plan.points)


def window(planner, site: Site, compiled: bool):
    """The site's window (address, size, its instructions) or why there is none, found
    with the compiled search or by the Python search alone."""
    if not compiled:
        planner.windows.searched_window = planner.windows.searched_entry = lambda site, size: None
    try:
        plan = planner.windows.window(site)
    except Refused as why:
        return str(why)
    finally:
        planner.windows.__dict__.pop("searched_window", None)
        planner.windows.__dict__.pop("searched_entry", None)
    return described(plan)


def compare_at_once(planner, sites) -> list:
    """Asserts that the windows asked all at once (Windows.of_sites) are the Python
    search's, site by site; the plans it made without asking one by one."""
    alone = []
    planner.windows.window, window_of = (lambda site: alone.append(site) or window_of(site)), \
        planner.windows.window
    try:
        found = planner.windows.of_sites(sites)
    finally:
        del planner.windows.window
    for site, plan in zip(sites, found):
        assert (plan if isinstance(plan, str) else described(plan)) == \
            window(planner, site, False), hex(site.address)
    asked = set(map(id, alone))
    return [plan for site, plan in zip(sites, found)
            if id(site) not in asked and not isinstance(plan, str)]


def indirect(plans) -> list:
    """The plans whose windows hold an indirect call or jump."""
    return [p for p in plans if any(i.mnemonic in ("call", "jmp", "notrack jmp") and
                                    not i.op_str.startswith("0x") for i in p.window.insns)]


def compare(planner, sites) -> int:
    """Asserts both searches give each site the same window; how many the compiled
    search answered itself."""
    answered = 0
    for site in sites:
        assert window(planner, site, True) == window(planner, site, False), hex(site.address)
        if site.at_entry:
            answered += planner.windows.searched_entry(site, planner.backend.patch_size) is not None
        else:
            answered += planner.windows.searched_window(site, planner.backend.patch_size) \
                is not None
            check_rows_read(planner, site)
    return answered


def check_rows_read(planner, site: Site) -> None:
    """What the engine gives of the rows the Python search reads: the window's alone
    when no other of them is marked, else all of them, each with its marked rows and
    direct targets as the sweep has them."""
    k = planner.model.holding_index(site)
    size = planner.backend.patch_size
    found = planner.model.search.inner(site.address, k, size, planner.windows.padding_end) \
        if k is not None else None
    if found is None:
        return
    first, last, end, (lo, edges, marked, direct) = found
    sweep = planner.model.sweep(planner.functions[k])
    at, first_row, end_row = sweep.edges.searchsorted(
        (site.address, site.address - planner.windows.MAX_LOOK_BACK, site.address + size)).tolist()
    end_row = min(end_row + 1, len(sweep))
    read = range(first_row if first < at else at, end_row)
    all_marked = set(sweep.marked.tolist())
    clean = all(r not in all_marked for r in read if not first <= r <= last)
    rows = range(first, last + 1) if clean else read
    assert lo == rows[0] and edges == sweep.edges[rows[0]:rows[-1] + 2].tolist()
    assert marked == [r - lo for r in rows if r in all_marked]
    targets = dict(zip(sweep.rows.tolist(), sweep.targets.tolist()))
    assert direct == [(r - lo, targets[r]) for r in rows if targets.get(r, -1) >= 0]


def entries(a) -> list:
    return [Site(fn, fn.address, KIND_ENTRY, fn.name, fn.name, exact=False) for fn in a.functions]


def exits(a) -> list:
    """A site at every exit of every function whose exits are found."""
    sites = []
    for fn in a.functions:
        site = Site(fn, fn.address, KIND_RETURN, fn.name, fn.name, exact=False)
        try:
            sites += a.planner.exits.exit_sites(site)
        except Refused:
            pass
    return sites


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=os.path.basename)
def test_every_exit_of_a_system_file(path):
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    a = prepared(path)
    sites = exits(a)
    assert len(sites) > 1000
    assert compare(a.planner, sites) > 0.8 * len(sites)
    assert compare(a.planner, entries(a)) > 0.8 * len(a.functions)
    at_once = compare_at_once(a.planner, sites)
    assert len(at_once) > 0.8 * len(sites)
    assert indirect(at_once)  # (their rows decoded where they lie: _made_rows)
    assert len(compare_at_once(a.planner, entries(a))) > 0.8 * len(a.functions)


def built(tmp_path, sample: str, flags: list) -> str:
    binary = str(tmp_path / sample)
    subprocess.run(["gcc", *flags, "-o", binary, os.path.join(SAMPLES, sample + ".c")],
                   check=True)
    return binary


@pytest.mark.parametrize("sample,flags", [("edges", ["-O0"]), ("edges", ["-O2"]),
                                          ("edges", ["-O3", "-fcf-protection=none"]),
                                          ("fragments", ["-O2"]), ("indirect_exits", ["-O2"])],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_exit_and_instruction_of_a_sample(sample, flags, tmp_path):
    """Tail calls, switches, short functions before padding, .cold parts, computed
    gotos; sites at every instruction too (USDT and address sites are inner sites)."""
    a = prepared(built(tmp_path, sample, flags))
    sites = exits(a) + entries(a)
    for fn in a.functions:
        for address in a.planner.model.sweep(fn).starts.tolist()[1:]:
            sites.append(Site(fn, address, KIND_ADDRESS, fn.name,
                              f"{fn.name}+{address - fn.address:#x}", exact=True))
    answered = compare(a.planner, sites)
    assert 0 < answered < len(sites)  # (some sites have no window: the Python search says why)
    assert 0 < len(compare_at_once(a.planner, sites)) < len(sites)


def test_what_it_does_not_know_is_left_to_the_python_search(tmp_path):
    """A .cold part's windows (its parent's jump tables may land in it) and those of a
    function swept another way: not answered."""
    planner = prepared(built(tmp_path, "indirect_exits", ["-O2"])).planner
    cold = [Site(fn, address, KIND_ADDRESS, fn.name, fn.name, exact=True)
            for fn in planner.functions if ".cold" in fn.name
            for address in planner.model.sweep(fn).starts.tolist()]
    assert cold and all(planner.windows.searched_window(s, 5) is None for s in cold)
    # a function the batch does not hold, as if swept by Capstone
    main = next(fn for fn in planner.functions if fn.name == "main")
    sites = [Site(main, address, KIND_ADDRESS, "main", "main", exact=True)
             for address in planner.model.sweep(main).starts.tolist()]
    assert any(planner.windows.searched_window(s, 5) is not None for s in sites)
    batch, swept = planner.model.batch
    planner.model.search, planner.model.batch = None, (batch, [f for f in swept if f is not main])
    assert all(planner.windows.searched_window(s, 5) is None for s in sites)


@pytest.mark.parametrize("path", SYSTEM_FILES[:2], ids=os.path.basename)
def test_rows_that_may_leave_a_function(path):
    """What the engine gives _exit_points, function by function, is what the Python
    loop over the sweep finds."""
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    planner = prepared(path).planner
    kinds = set()
    for fn in planner.functions:
        index = planner.model.index_of(fn)
        assert planner.functions[index] is fn
        found = planner.exits.exit_rows(fn, lambda a: fn.address <= a < fn.end, index)
        planner.model.search, search = None, planner.model.search
        planner.model.batch, batch = None, planner.model.batch
        try:
            assert planner.exits.exit_rows(fn, lambda a: fn.address <= a < fn.end, index) == found
        finally:
            planner.model.search, planner.model.batch = search, batch
        kinds.update(kind for _, kind, _, _ in found)
    assert kinds == {JUMP, BRANCH, RETURN, OTHER}
