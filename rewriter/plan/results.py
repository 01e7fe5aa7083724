"""What planning gives: a plan per window (its points, and how it is patched), or a
refusal with its reason; and the small records the planner keeps and sends between
processes (rewriter/parallel.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, NamedTuple, Optional, Union

from urewrite.arch.base import Window, value_class
from urewrite.rewriter.plan.tactics import JUMP, Hop, Pun
from urewrite.rewriter.selectors import Site


@value_class
class ProbePoint:
    address: int  # the displaced instruction the sites' probes fire before
    sites: tuple
    flags_live: bool
    taken: bool = False  # they fire only when the branch there is taken (a conditional exit)
    stays_within: tuple = ()  # they fire only when the indirect jump there leaves these ranges


@value_class
class Plan:
    """A window, and the points in it where probes fire (one trampoline)."""
    window: Window
    points: tuple
    hop: Optional[Hop] = None
    pun: Optional[Pun] = None

    @property
    def patching(self):
        """How the window is patched (plan/tactics.py): its Pun, its Hop, else the plain
        JUMP; each writes its own patches and stubs."""
        return self.pun or self.hop or JUMP

    @property
    def tactic(self) -> str:
        """How the window is patched: "jump" (a jump to the trampoline in the window),
        "hop" (a short jump to a landing in padding), "evict" (to a landing that an
        evicted neighbour window frees), "pun" (a jump ending in the bytes after it)."""
        return self.patching.name

    @property
    def site(self) -> Site:
        return self.points[0].sites[0]

    @property
    def sites(self) -> tuple:
        return tuple(site for point in self.points for site in point.sites)

    def without(self, keys) -> "Plan":
        """This plan less the sites whose probe key is in `keys` (None if none is left)."""
        if len(self.points) == 1 and len(self.points[0].sites) == 1:  # (most: quicker)
            if self.points[0].sites[0].probe_key not in keys:
                return self
        elif not any(s.probe_key in keys for p in self.points for s in p.sites):
            return self
        points = tuple(replace(p, sites=tuple(s for s in p.sites if s.probe_key not in keys))
                       for p in self.points)
        points = tuple(p for p in points if p.sites)
        return replace(self, points=points) if points else None


@value_class
class Refusal:
    site: Site
    reason: str


Outcome = Union[Plan, Refusal]


class Refused(Exception):
    """Raised where a site cannot be patched safely; its text is the reason."""


class Verdict(NamedTuple):
    """Whether something may branch into a window after its first byte, as far as it is
    worked out: not `known` yet, or known with `reason` None (nothing may) or why."""
    known: bool
    reason: Optional[str] = None


UNKNOWN = Verdict(False)  # (not worked out ahead: asked when the window is checked)


class WindowFound(NamedTuple):
    """A window precompute found for a site of one point, kept without the site (sent
    between processes; the planner makes the plan again for the site)."""
    window: Window
    point: int  # the address where the probe fires
    flags_live: bool
    reason: Optional[str]  # what may branch into it, or None


class Prepared(NamedTuple):
    """What a child of Planner.prepare() found for the functions it took (by address)."""
    functions: List[int]  # those it took
    direct: Dict[int, Dict[int, int]]  # their direct branch targets, where asked
    tables: Dict[int, dict]  # their jump tables
    unknown_jumps: Dict[int, Optional[int]]  # their first indirect jump of no table
    computed: Dict[int, list]  # the addresses they compute, where asked
    sweeps: tuple  # their sweeps (Sweep.pack), unless swept ahead


class Precomputed(NamedTuple):
    """What a process of Planner.precompute() found for the sites it took."""
    exits: Dict[int, object]  # function -> its exit points, or why not
    windows: Dict[tuple, object]  # window key -> WindowFound, or why there is none
    redirect_problems: Dict[int, Optional[str]]  # function -> why its return cannot be redirected
    retried: Dict[tuple, Optional[WindowFound]]  # window key -> the window retried, or None
