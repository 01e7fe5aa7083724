"""The jump-table walk finds the instructions that write a register (a table base set
once, outside the dispatch) from each instruction's bytes, looked up among facts kept
across functions (x86_64), instead of decoding the whole function: the same tables on
every function of system files, and the lookup is what answers."""

import os

import pytest

from urewrite.arch import jump_tables
from urewrite.rewriter.pipeline import analyse

FILES = ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/lib/x86_64-linux-gnu/libc.so.6",
         "/usr/bin/python3.11", "/usr/bin/perl"]


def tables(path: str, facts: bool, monkeypatch) -> tuple:
    """(jump address -> (table, count, targets) of every function, writers() answers
    given from facts)."""
    answered = []
    by_facts = jump_tables.Semantics.writers_by_facts

    def counted(self, family, found):
        owners = by_facts(self, family, found)
        answered.append(owners is not None)
        return owners
    monkeypatch.setattr(jump_tables.Semantics, "writers_by_facts", counted)
    planner = analyse(path).planner
    if not facts:
        planner.backend.jump_table_facts = None
    found = {}
    for fn in planner.functions:
        for jump, t in planner.model.jump_tables(fn).items():
            found[jump] = (t.table, t.count, t.targets, t.guarded, t.entry)
    return found, answered


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_the_same_tables_with_and_without_facts(path, monkeypatch):
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    with_facts, answered = tables(path, True, monkeypatch)
    without, not_asked = tables(path, False, monkeypatch)
    assert with_facts == without
    assert len(with_facts) > 10 and not not_asked
    assert any(answered)  # (writers found: not every walk stops at a call first)


FAMILIES = "rax rbx rcx rdx rsi rdi rbp r8 r12 r13 r14 r15".split()


@pytest.mark.parametrize("path", FILES[1:2], ids=os.path.basename)
def test_writers_from_facts_are_those_of_the_decoded_function(path):
    """Semantics.writers(), register by register: the same writers (or None) from facts
    as from decoding the function, on functions with an indirect jump and a sample of
    the others."""
    from urewrite.arch.base import SweptCode
    from urewrite.arch.x86_64.jump_tables import _X86
    if not os.path.exists(path):
        pytest.skip(f"needs Debian's {path}")
    planner = analyse(path).planner
    backend = planner.backend
    chosen = [fn for k, fn in enumerate(planner.functions)  # (decoding the biggest is slow)
              if fn.size and len(planner.model.sweep(fn)) < 1500 and
              (planner.model.indirect_jumps(fn) or k % 100 == 0)]
    compared = found = 0
    for fn in chosen:
        def semantics(facts):
            sem = _X86(backend, SweptCode(planner.model.sweep(fn), backend.decode,
                                          planner.elf.read),
                       planner.elf.read)
            sem.facts = facts
            return sem
        by_facts, decoded = semantics({}), semantics(None)
        for family in FAMILIES:
            a, b = by_facts.writers(family), decoded.writers(family)
            assert (a is None) == (b is None), (fn.name, family)
            if a is not None:
                assert [(k, d.address, d.size) for k, d in a] == \
                    [(k, d.address, d.size) for k, d in b], (fn.name, family)
                found += len(a)
            compared += 1
    assert compared > 1000 and found > 100
