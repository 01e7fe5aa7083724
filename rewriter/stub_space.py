"""Where the stubs of punned jumps may go (docs/design.md, "Patch tactics").

A punned jump goes wherever the bytes it keeps say; a stub there jumps on to the
trampoline. A stub may go only above the new code and state (`layout.stub_floor`),
within the stub's own reach of its trampoline, on no other stub, and on pages that
stubs already use or on new ones within the cap (each run of stub pages is a program
header: layout.stub_page_cap).

A backend's search tries many candidate addresses (tens of thousands for one site) and
takes the first that fit: `first` and `first_in_rows`. They ask the backend's compiled
search where it has one (Backend.stub_places_engine: x86_64's, in Rust), which stops at
the first that fit; else `fit` answers for a whole array at once, so the search costs a
few numpy passes, not a Python call per candidate. `fit` is the reference;
arch/x86_64/native/src/stub_places.rs mirrors its rules one candidate at a time, and
tests/test_stub_space.py holds the two to the same answers.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from urewrite.rewriter import layout

REACH = (1 << 31) - 64  # a stub's rel32 jump reaches its trampoline in the new code


class StubSpace:
    def __init__(self, floor: int, size: int, page_cap: Callable[[], int],
                 engine: Optional[type] = None):
        self.floor = floor
        self.size = size  # bytes of one stub (the backend's patch jump)
        self._page_cap = page_cap  # (read when first needed)
        self._cap = None
        self._engine = engine  # (made when first asked, with the cap)
        self._compiled = None
        self.pages: set = set()  # the pages of the stubs taken
        # fit()'s arrays: the stubs taken and their pages, sorted, brought up to date
        # with the stubs taken `_later` when asked (_arrays())
        self._starts = np.zeros(0, dtype=np.int64)
        self._known = np.zeros(0, dtype=np.int64)
        self._later: list = []

    def pages_allowed(self) -> int:
        """How many pages the stubs may take (the cap given, read now)."""
        return self._page_cap()

    def first(self, stubs: np.ndarray, source: int, taken: Sequence[int] = (),
              limit: int = 1) -> np.ndarray:
        """The indices of the first `limit` of `stubs` (1-D) that may take the stub of
        the jump at `source` (with the stubs `taken` taken too), in order."""
        compiled = self._compiled_search()
        if compiled is not None:
            return np.array(compiled.first(np.ascontiguousarray(stubs, dtype=np.int64).tobytes(),
                                           source, [int(t) for t in taken], limit), dtype=np.int64)
        return np.flatnonzero(self.fit(stubs, source, taken))[:limit]

    def first_in_rows(self, stubs: np.ndarray, source: int,
                      taken: np.ndarray) -> Optional[Tuple[int, int]]:
        """(row, column) of the first stub that fits in the first row that has one, of
        2-D `stubs`, each row's with its stub of `taken` taken too; None if none."""
        compiled = self._compiled_search()
        if compiled is not None:
            return compiled.first_in_rows(np.ascontiguousarray(stubs, dtype=np.int64).tobytes(),
                                          stubs.shape[1], source, [int(t) for t in taken])
        found = self.fit(stubs, source, taken)
        rows = np.flatnonzero(found.any(axis=1))
        if not len(rows):
            return None
        return int(rows[0]), int(np.argmax(found[rows[0]]))

    def _compiled_search(self):
        if self._compiled is None and self._engine is not None:
            if self._cap is None:
                self._cap = self._page_cap()
            self._compiled = self._engine(self.floor, self.size, REACH, layout.PAGE, self._cap)
            for stub in self._arrays()[0].tolist():
                self._compiled.take(stub)
        return self._compiled

    def fit(self, stubs: np.ndarray, source: int, taken: Sequence[int] = ()) -> np.ndarray:
        """Which of `stubs` (int64 addresses) may take the stub of the jump at `source`,
        when the stubs `taken` are taken too: a boolean array. With 2-D `stubs`, `taken`
        is an array of one stub per row, taken with that row's alone (many pairs of
        stubs at once: a punned jump and its successor's)."""
        if self._cap is None:
            self._cap = self._page_cap()
        starts, known = self._arrays()
        if stubs.ndim == 2:
            ok = (stubs >= self.floor) & (stubs <= source + REACH)
            if not ok.any():
                return ok
            ok = self._fit_rows(stubs, ok, np.asarray(taken, dtype=np.int64)[:, None], known)
            left = np.nonzero(ok)  # (the costly test last, on what is left, as below)
            ok[left] = clear_of(stubs[left], starts, self.size)
            return ok
        pages = self.pages
        if len(taken):
            pages = pages.union(*(self._pages_of(stub) for stub in taken))
        if len(pages) != len(known):
            known = np.array(sorted(pages), dtype=np.int64)
        if len(pages) >= self._cap and len(stubs) > 64 and bool((stubs[1:] >= stubs[:-1]).all()):
            # no page more may be used, and the candidates are sorted (a search's): only
            # those starting on a page in use can fit, found by a binary search per page
            # (most searches of a big file, where the cap is met early); the test on
            # those alone
            on = _runs(np.searchsorted(stubs, known), np.searchsorted(stubs, known + layout.PAGE))
            ok = np.zeros(len(stubs), dtype=bool)
            ok[on] = self._fit_each(stubs[on], source, taken, pages, known, starts)
            return ok
        return self._fit_each(stubs, source, taken, pages, known, starts)

    def _fit_each(self, stubs: np.ndarray, source: int, taken: Sequence[int], pages: set,
                  known: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """fit() of 1-D `stubs`, with the pages in use `pages` (a set, the `taken` stubs'
        included; `known`: as a sorted array) and the stubs taken `starts` (sorted)."""
        size = self.size
        ok = (stubs >= self.floor) & (stubs <= source + REACH)
        if not ok.any():  # (many searches lie wholly below the floor)
            return ok
        for stub in taken:
            ok &= np.abs(stubs - stub) >= size
        first, last = stubs & -layout.PAGE, (stubs + size - 1) & -layout.PAGE
        new = (~in_sorted(first, known)).astype(np.int64)
        across = np.flatnonzero(last != first)  # (few: stubs that cross a page's end)
        new[across] += ~in_sorted(last[across], known)
        ok &= len(pages) + new <= self._cap
        # the costly test (a search among every stub taken) last, on what is left: past
        # the cap on pages, most candidates of a search are out already
        left = np.flatnonzero(ok)
        ok[left] = clear_of(stubs[left], starts, size)
        return ok

    def _fit_rows(self, stubs: np.ndarray, ok: np.ndarray, taken: np.ndarray,
                  known: np.ndarray) -> np.ndarray:
        """fit() of 2-D `stubs` (`ok`: what fits before the stub taken with each row,
        `taken`: that stub, a column)."""
        size = self.size
        ok = ok & (np.abs(stubs - taken) >= size)
        # the pages of each row's taken stub, and how many of them are new
        taken_first, taken_last = taken & -layout.PAGE, (taken + size - 1) & -layout.PAGE
        pages = len(self.pages) + (~in_sorted(taken_first, known)).astype(np.int64) + \
            ((taken_last != taken_first) & ~in_sorted(taken_last, known))

        def new(page: np.ndarray, where=...) -> np.ndarray:
            """Which pages (of the stubs at `where`) are no page used, nor the taken
            stub's."""
            firsts = np.broadcast_to(taken_first, stubs.shape)[where]
            lasts = np.broadcast_to(taken_last, stubs.shape)[where]
            return ~in_sorted(page, known) & (page != firsts) & (page != lasts)

        first, last = stubs & -layout.PAGE, (stubs + size - 1) & -layout.PAGE
        added = new(first).astype(np.int64)
        across = np.nonzero(last != first)  # (few: stubs that cross a page's end)
        added[across] += new(last[across], across)
        if self._cap is None:
            self._cap = self._page_cap()
        return ok & (pages + added <= self._cap)

    def take(self, stub: int) -> None:
        if self._compiled is not None:
            self._compiled.take(stub)  # (it checks that the stub overlaps none)
        else:
            starts = self._arrays()[0]
            k = int(np.searchsorted(starts, stub))
            assert (k == len(starts) or starts[k] - stub >= self.size) and \
                (k == 0 or stub - starts[k - 1] >= self.size), hex(stub)
        self._later.append(stub)
        self.pages |= self._pages_of(stub)

    def taken(self) -> np.ndarray:
        """The stubs taken, sorted."""
        return self._arrays()[0]

    def _arrays(self) -> tuple:
        """fit()'s arrays, up to date: the stubs taken since put in place, not the
        arrays made again from all of them at each stub taken."""
        if self._later:
            later = np.sort(np.array(self._later, dtype=np.int64))
            self._starts = np.insert(self._starts, np.searchsorted(self._starts, later), later)
            self._later = []
        if len(self._known) != len(self.pages):
            self._known = np.array(sorted(self.pages), dtype=np.int64)
        return self._starts, self._known

    def _pages_of(self, stub: int) -> set:
        return {stub & -layout.PAGE, (stub + self.size - 1) & -layout.PAGE}


def clear_of(stubs: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """Which stubs lie `size` bytes or more from each of `starts` (sorted)."""
    if not len(starts):
        return np.ones(stubs.shape, dtype=bool)
    if stubs.ndim == 1 and len(stubs) > 64 and bool((stubs[1:] >= stubs[:-1]).all()):
        # sorted (a search's candidates, in order): the few taken stubs near them each
        # rule out a run of them, marked; not a search among every stub per candidate
        lo, hi = np.searchsorted(starts, (stubs[0] - size, stubs[-1] + size), side="right")
        near = starts[lo:hi]
        return ~_in_runs(len(stubs), np.searchsorted(stubs, near - size + 1),
                         np.searchsorted(stubs, near + size))
    k = np.searchsorted(starts, stubs)
    after = starts[np.minimum(k, len(starts) - 1)]
    before = starts[np.maximum(k - 1, 0)]
    return ((k == len(starts)) | (after - stubs >= size)) & ((k == 0) | (stubs - before >= size))


def in_sorted(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Which values are in `known` (sorted): a binary search each (np.isin sorts both)."""
    if not len(known):
        return np.zeros(values.shape, dtype=bool)
    if values.ndim == 1 and len(values) > 8 * len(known) and \
            bool((values[1:] >= values[:-1]).all()):
        # sorted (the pages of a search's candidates, in order), and few known: the run
        # of each known value among them, marked; a binary search per known value
        # instead of one per value
        return _in_runs(len(values), np.searchsorted(values, known, side="left"),
                        np.searchsorted(values, known, side="right"))
    k = np.minimum(np.searchsorted(known, values), len(known) - 1)
    return known[k] == values


def _runs(firsts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The positions of the runs [firsts[i], ends[i]) (ascending, not overlapping), in
    order: without a pass over all positions, as _in_runs makes."""
    lengths = ends - firsts
    return np.repeat(firsts - np.cumsum(lengths) + lengths, lengths) + \
        np.arange(int(lengths.sum()))


def _in_runs(n: int, firsts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which of n positions lie in any of the runs [firsts[i], ends[i]): each run
    marked at its ends, then summed along."""
    marks = np.zeros(n + 1, dtype=np.int64)
    np.add.at(marks, firsts, 1)
    np.add.at(marks, ends, -1)
    return np.cumsum(marks[:-1]) > 0
