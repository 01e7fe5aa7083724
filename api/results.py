"""What the API returns: small typed records, one per row of what the command line
shows (`urewrite IN --json`, `list --json`, `stat --json`). Rows are named tuples (a
rewrite of every function of a big file makes 100,000s of them), reports dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional


# -- a rewrite ---------------------------------------------------------------------------

class PlacedProbe(NamedTuple):
    """A site patched: a return probe has one per exit it patched, at the exit."""
    name: str
    kind: str  # "entry", "return", "usdt" or "address"
    address: int
    tactic: str  # how its window is patched: "jump", "hop", "evict" or "pun"
    displaced: int  # bytes of instructions the patch displaces


class RefusedSite(NamedTuple):
    """A site that could not be patched safely, and why."""
    name: str
    kind: str
    address: int
    reason: str


@dataclass
class RewriteResult:
    output: str  # the file written
    probes: List[PlacedProbe]  # every site patched
    refusals: List[RefusedSite]
    warnings: List[str]  # what the command line prints as "urewrite: warning: ..."
    notes: List[str]  # what it prints as "urewrite: note: ..." (a program's probes)
    probe_count: int  # probes placed (a probe may have several sites: USDT, return exits)
    tactics: Dict[str, int]  # windows patched per tactic, every tactic named


# -- list --------------------------------------------------------------------------------

class ReturnProbe(NamedTuple):
    """How a return probe of the function would work."""
    mechanism: Optional[str]  # "exit sites", "redirection", or None: refused
    exits: int  # exit sites it would patch
    tactics: Dict[str, int]  # exits per tactic
    checked: int  # exits at indirect jumps, counted only when they leave
    reason: Optional[str]  # why refused, or why its return address is redirected


class FunctionSite(NamedTuple):
    """A function's entry, as a row of `list`."""
    name: str
    aliases: List[str]  # other symbols at its address
    demangled: List[str]  # C++ and Rust display names
    address: int
    size: int
    sized_by: str
    origin: str
    split_off: bool  # a part split off from a function (.cold)
    patchable: bool
    displaced: Optional[int]
    tactic: Optional[str]
    reason: Optional[str]  # why not patchable
    return_probe: ReturnProbe
    convention: Optional[str] = None  # a Go program's: how --args reads its arguments
    convention_note: Optional[str] = None


class UsdtSite(NamedTuple):
    """A USDT probe's site, as a row of `list`."""
    provider: str
    name: str
    address: int
    semaphore: Optional[int]
    arguments: str
    function: str
    patchable: bool
    displaced: Optional[int]
    tactic: Optional[str]
    reason: Optional[str]


@dataclass
class Listing:
    file: str
    functions: List[FunctionSite]
    usdt: List[UsdtSite]


# -- counts ------------------------------------------------------------------------------

class Bucket(NamedTuple):
    """Latency samples in [lo_ns, hi_ns)."""
    lo_ns: int
    hi_ns: int
    count: int


class ProbeCount(NamedTuple):
    object: str  # the rewritten file's name
    name: str
    kind: str
    address: int
    hits: int
    histogram: Optional[List[Bucket]]  # entry-to-return latency, when measured


@dataclass
class Counts:
    """What `stat --json` reports: hits per probe, added up over processes."""
    processes: int
    probes: List[ProbeCount]
    returns_missed: int  # calls whose return address could not be redirected
    latency_missed: int  # returns that gave no latency sample
    problems: List[str] = field(default_factory=list)  # region files skipped, and why
    programs: List[dict] = field(default_factory=list)  # built-in programs' maps

    def hits(self, name: str, kind: Optional[str] = None, obj: Optional[str] = None) -> int:
        """Hits of the probes named `name` (of that kind, in the object `obj`), added up."""
        return sum(p.hits for p in self.probes if p.name == name and kind in (None, p.kind)
                   and obj in (None, p.object))


@dataclass
class CommandRun:
    exit_code: int  # shell-style: 128+N when signal N ended it
    counts: Counts


@dataclass
class ArmedProcesses:
    """The processes `arm` armed; `counts` once the block has ended and they are
    disarmed."""
    pids: List[int]
    problems: List[str] = field(default_factory=list)
    counts: Optional[Counts] = None
