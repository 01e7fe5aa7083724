"""StubSpace.fit answers for many candidate stubs at once; its 2-D form (a taken stub per
row, for a punned jump and its successor's) must say what asking row by row says."""

import random

import numpy as np
import pytest

from urewrite.arch.x86_64 import linear_sweep
from urewrite.rewriter import layout
from urewrite.rewriter.stub_space import StubSpace

FLOOR = 0x4000_0000


def _space(rng: random.Random, stubs: int, cap: int) -> StubSpace:
    space = StubSpace(FLOOR, 5, lambda: cap)
    for _ in range(stubs):  # a few stubs taken, on a few pages, some across a page end
        page = FLOOR + rng.randrange(6) * layout.PAGE
        stub = page + rng.choice([0, 100, layout.PAGE - 3, rng.randrange(layout.PAGE)])
        if all(space.fit(np.array([stub], dtype=np.int64), FLOOR)):
            space.take(stub)
    return space


@pytest.mark.parametrize("seed", range(12))
def test_fit_of_rows_is_fit_row_by_row(seed):
    rng = random.Random(seed)
    space = _space(rng, rng.randrange(0, 12), cap=rng.randrange(1, 9))
    near = [FLOOR - 64 + rng.randrange(8 * layout.PAGE) for _ in range(40)]
    taken = np.array(near[:8], dtype=np.int64)
    stubs = np.array([[rng.choice(near) + rng.randrange(-8, 8) for _ in range(32)]
                      for _ in range(8)], dtype=np.int64)
    source = FLOOR + rng.choice([0, 2 * layout.PAGE])
    rows = space.fit(stubs, source, taken)
    for k in range(len(taken)):
        assert rows[k].tolist() == space.fit(stubs[k], source, (int(taken[k]),)).tolist()
    # (the test means something: some fit and some do not)
    if seed == 0:
        assert rows.any() and not rows.all()


@pytest.mark.parametrize("seed", range(6))
def test_member_is_isin(seed):
    from urewrite.rewriter.stub_space import in_sorted
    rng = np.random.default_rng(seed)
    known = np.unique(rng.integers(0, 300, size=rng.integers(0, 30)))
    for values in (np.sort(rng.integers(0, 300, size=2000)),  # sorted, many: runs marked
                   rng.integers(0, 300, size=2000), np.sort(rng.integers(0, 300, size=5))):
        assert in_sorted(values, known).tolist() == np.isin(values, known).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_clear_of_sorted_candidates_is_clear_of_each(seed):
    from urewrite.rewriter.stub_space import clear_of
    rng = np.random.default_rng(seed)
    starts = np.unique(rng.integers(0, 4000, size=rng.integers(1, 60)))
    for stubs in (np.arange(rng.integers(0, 100), 4100, 8),  # a search's candidates: runs marked
                  np.sort(rng.integers(-20, 4100, size=500)), rng.integers(0, 4000, size=300)):
        each = [all(abs(int(x) - int(s)) >= 5 for s in starts) for x in stubs]
        assert clear_of(stubs, starts, 5).tolist() == each


@pytest.mark.parametrize("seed", range(8))
def test_fit_with_no_page_to_spare_is_fit_of_each(seed):
    """Once the stubs use as many pages as the cap allows, fit() looks only at the
    candidates on those pages: the same answers as asking one candidate at a time
    (which takes the general way), sorted candidates or not, with stubs taken too."""
    rng = random.Random(seed)
    space = _space(rng, 12, cap=rng.randrange(1, 4))
    assert space.pages and len(space.pages) == space.pages_allowed()  # (no page to spare)
    stubs = sorted(FLOOR - 64 + rng.randrange(8 * layout.PAGE) for _ in range(300))
    for candidates in (np.array(stubs, dtype=np.int64),
                       np.array(rng.sample(stubs, len(stubs)), dtype=np.int64)):
        for taken in ((), (int(candidates[0]),), (FLOOR + 7 * layout.PAGE + 9,)):
            found = space.fit(candidates, FLOOR, taken)
            assert found.tolist() == [bool(space.fit(np.array([x]), FLOOR, taken)[0])
                                      for x in candidates.tolist()]
            if not taken:  # (the test means something: some fit and some do not)
                assert found.any() and not found.all()


def _fits_by_rules(space: StubSpace, stub: int, source: int, taken=()) -> bool:
    """The rules of a stub's place, one candidate at a time: above the floor, within
    reach of its source, clear of every stub taken (and of `taken`), and on pages that
    keep the stubs' pages within the cap."""
    size = space.size
    others = [int(s) for s in space.taken()] + list(taken)
    pages = set(space.pages)
    for s in list(taken) + [stub]:
        pages |= {s & -layout.PAGE, (s + size - 1) & -layout.PAGE}
    return (stub >= FLOOR and stub <= source + (1 << 31) - 64
            and all(abs(stub - s) >= size for s in others) and len(pages) <= space.pages_allowed())


@pytest.mark.parametrize("seed", range(10))
def test_fit_is_the_rules_written_out(seed):
    """fit(), in each of its forms (sorted candidates, any order, rows with a stub taken
    each), against the rules asked of each candidate alone; candidates and stubs taken
    across a page's end among them, as stubs are taken one by one."""
    rng = random.Random(seed)
    space = _space(rng, rng.randrange(0, 10), cap=rng.randrange(1, 7))
    for _ in range(3):
        near = sorted({FLOOR - 8 + rng.randrange(8 * layout.PAGE) for _ in range(200)} |
                      {FLOOR + k * layout.PAGE - rng.randrange(1, 6) for k in range(1, 8)})
        source = FLOOR + rng.choice([0, 2 * layout.PAGE])
        for candidates in (near, rng.sample(near, len(near))):
            for taken in ((), (FLOOR + 3 * layout.PAGE - 2,)):
                found = space.fit(np.array(candidates, dtype=np.int64), source, taken)
                assert found.tolist() == [_fits_by_rules(space, c, source, taken)
                                          for c in candidates]
        rows = np.array([rng.sample(near, 16) for _ in range(6)], dtype=np.int64)
        row_taken = np.array([rng.choice(near) for _ in range(6)], dtype=np.int64)
        found = space.fit(rows, source, row_taken)
        assert found.tolist() == [[_fits_by_rules(space, int(c), source, (int(t),)) for c in row]
                                  for row, t in zip(rows, row_taken)]
        fitting = [c for c in near if _fits_by_rules(space, c, source)]
        if fitting:
            space.take(rng.choice(fitting))
    assert space.pages


ENGINE = getattr(linear_sweep.native_sweep, "StubPlaces", None)


@pytest.mark.skipif(ENGINE is None, reason="the native module was not built (no Rust toolchain)")
@pytest.mark.parametrize("seed", range(16))
def test_first_compiled_is_first_of_fit(seed):
    """The compiled search (x86_64's native module) finds the very stubs numpy's fit()
    finds first: sorted candidates and not, with stubs taken, rows each with its own
    taken stub; before the cap on pages is met and after. Part of the stubs are taken
    before the compiled search is first asked (it is made then, and told of them)."""
    rng = random.Random(seed)
    cap = rng.randrange(1, 7)
    plain, compiled = (StubSpace(FLOOR, 5, lambda: cap, engine) for engine in (None, ENGINE))
    for _ in range(rng.randrange(0, 6)):
        stub = FLOOR + rng.randrange(6) * layout.PAGE + rng.choice([0, layout.PAGE - 3, 77])
        if plain.fit(np.array([stub]), FLOOR)[0]:
            plain.take(stub)
            compiled.take(stub)
    seen = 0
    for _ in range(12):
        near = sorted({FLOOR - 8 + rng.randrange(8 * layout.PAGE) for _ in range(300)} |
                      {FLOOR + k * layout.PAGE - rng.randrange(1, 6) for k in range(1, 8)})
        source = FLOOR + rng.choice([0, 2 * layout.PAGE, -(1 << 31)])
        for candidates in (near, rng.sample(near, len(near))):
            candidates = np.array(candidates, dtype=np.int64)
            for taken in ((), (FLOOR + 3 * layout.PAGE - 2,), (int(candidates[5]),)):
                for limit in (1, 3, 64):
                    expected = np.flatnonzero(plain.fit(candidates, source, taken))[:limit]
                    assert compiled.first(candidates, source, taken, limit).tolist() == \
                        plain.first(candidates, source, taken, limit).tolist() == \
                        expected.tolist()
                    seen += len(expected)
        rows = np.array([sorted(rng.sample(near, 16)) for _ in range(6)], dtype=np.int64)
        row_taken = np.array([rng.choice(near) for _ in range(6)], dtype=np.int64)
        assert compiled.first_in_rows(rows, source, row_taken) == \
            plain.first_in_rows(rows, source, row_taken)
        assert compiled.fit(rows, source, row_taken).tolist() == \
            plain.fit(rows, source, row_taken).tolist()  # (its arrays, made as asked)
        found = plain.first(np.array(near, dtype=np.int64), source, limit=len(near))
        if len(found):  # (one that fits, taken: on a new page while there are some)
            stub = near[rng.choice(found.tolist())]
            plain.take(stub)
            compiled.take(stub)
            with pytest.raises(ValueError):
                compiled.take(stub + 4)  # (overlaps it)
            with pytest.raises(AssertionError):
                plain.take(stub - 4)
    assert seen and len(plain.pages) == cap  # (the cap met along the way)
