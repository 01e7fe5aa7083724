"""What may branch into a window, asked of many windows at once: BranchSafety.clear_of_branches
says a window is clear only where BranchSafety.branch_into, asked alone, finds nothing (a
taken address, a branch target, a case label, a landing pad), and says so of most of
the windows `list` asks about."""

import os
import random
import shutil
import subprocess

import pytest

from urewrite.arch.base import Window
from urewrite.rewriter import pipeline
from urewrite.rewriter.plan.results import Plan, ProbePoint, Refused
from urewrite.rewriter.selectors import Site
from urewrite.trampolines.region import KIND_ADDRESS, KIND_ENTRY

FILES = ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/python3.11",
         "/lib/x86_64-linux-gnu/libc.so.6"]


def _windows(a, rng: random.Random) -> list:
    """Windows of whole instructions the planner could make: every entry's, and some
    of two to six instructions anywhere in the functions (so over branch targets,
    landing pads and taken addresses too)."""
    planner, plans = a.planner, []
    for fn in a.functions:
        if not fn.size:
            continue
        try:
            plans.append(planner.windows.window(Site(fn, fn.address, KIND_ENTRY, fn.name, fn.name,
                                              exact=False)))
        except Refused:
            pass
        sweep = planner.model.sweep(fn)
        if len(sweep) < 3 or rng.random() < 0.5:
            continue
        first = rng.randrange(len(sweep) - 1)
        last = min(first + rng.randrange(1, 6), len(sweep) - 1)
        try:
            insns = tuple(planner.model.rows(fn, first, last + 1))
        except Refused:
            continue
        start, end = insns[0].address, insns[-1].end
        site = Site(fn, start, KIND_ADDRESS, fn.name, fn.name, exact=False)
        plans.append(Plan(Window(start, end - start, insns),
                          (ProbePoint(start, (site,), True),)))
    return plans


@pytest.mark.parametrize("path", FILES)
def test_windows_said_clear_at_once_are_clear_asked_alone(path):
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    a = pipeline.analyse(path)
    a.planner.prepare(a.functions)
    plans = _windows(a, random.Random(path))
    taken = a.planner.safety.taken_in_windows(plans)
    clear = a.planner.safety.clear_of_branches(plans, taken)
    reasons = [a.planner.safety.branch_into(plan, taken) for plan in plans]
    for plan, said, reason in zip(plans, clear, reasons):
        assert not said or reason is None, (hex(plan.window.address), reason)
    # it answers for most (else it is not worth asking), and the rest are not all clear
    assert sum(clear) > 0.8 * sum(reason is None for reason in reasons)
    kinds = {reason.split(" ")[1] for reason in reasons if reason}
    assert len(kinds) >= 2 and ("C++" in kinds or "libstdc++" not in path), kinds


def test_a_file_not_prepared_asks_every_window():
    """Before prepare() has seen every function's branch targets, no window is known
    clear at once: each is asked alone."""
    a = pipeline.analyse(FILES[2]) if os.path.exists(FILES[2]) else pytest.skip("no libc")
    plans = _windows(a, random.Random(1))[:200]
    assert a.planner.safety.clear_of_branches(plans, {}) == [False] * len(plans)


@pytest.mark.parametrize("path", FILES)
def test_branches_from_outside_found_with_arrays_are_found_without(path):
    """_branch_from_outside() first asks every function's branches at once
    (_pairs_from_outside) whether any lands inside a function from outside its parts,
    and looks at its neighbours' branches one by one only where one does: the same
    answer as looking every time, for every function of the file (glibc's string
    functions share code: some are entered so), each as if the byte scans had marked it."""
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    a = pipeline.analyse(path)
    planner = a.planner
    planner.prepare(a.functions)
    planner.model.entered = None  # (every function asked in full, not only those marked)
    pairs, found, asked_alone = planner.model.branch_pairs, 0, 0
    for fn in a.functions:
        if not fn.size:
            continue
        parts = planner.model.parts(fn)

        def inside(address: int) -> bool:
            return any(p.address <= address < p.end for p in parts)

        with_arrays = planner.safety.branch_from_outside(fn, parts, inside)
        planner.model.branch_pairs = None
        try:
            assert planner.safety.branch_from_outside(fn, parts, inside) == with_arrays, fn.name
        finally:
            planner.model.branch_pairs = pairs
        interior = planner.model.sweep(fn).starts
        asked_alone += planner.safety.pairs_from_outside(parts, interior[interior != fn.address])
        found += with_arrays is not None
    # (the arrays send few to the loop but those something does enter)
    assert found > 5 and asked_alone - found < len(a.functions) // 10, (found, asked_alone)


AFTER = r"""
int shared_b(int), after_near(int);
__asm__(
    ".text\n"
    ".globl shared_b\n.type shared_b,@function\nshared_b:\n"
    "    mov $2, %eax\n    nop\n    nop\n    nop\n    nop\n    nop\n"
    "tail:\n    add %edi, %eax\n    ret\n.size shared_b, .-shared_b\n"
    ".globl after_near\n.type after_near,@function\nafter_near:\n"
    "    mov $1, %eax\n    jmp tail\n.size after_near, .-after_near\n");
int main(int argc, char **argv) { return shared_b(argc) + after_near(argc); }
"""


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_a_short_branch_back_from_a_later_function_is_found_with_arrays(tmp_path):
    """The branch into shared_b's tail comes from the function after it (a short jump,
    which the byte scans do not see): found with the file's branches at once as by
    looking at the neighbours."""
    (tmp_path / "after.c").write_text(AFTER)
    binary = tmp_path / "after"
    subprocess.run(["gcc", "-O2", "-no-pie", tmp_path / "after.c", "-o", binary], check=True)
    a = pipeline.analyse(str(binary))
    planner = a.planner
    planner.prepare(a.functions)
    fn = next(f for f in a.functions if f.name == "shared_b")
    source = next(f for f in a.functions if f.name == "after_near").address + 5

    def inside(address: int) -> bool:
        return fn.address <= address < fn.end

    planner.model.entered = None
    found = planner.safety.branch_from_outside(fn, [fn], inside)
    assert found is not None and found[1] == source
    planner.model.branch_pairs = None
    assert planner.safety.branch_from_outside(fn, [fn], inside) == found
