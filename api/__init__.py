"""urewrite as a Python library: what the command line does, without printing, with
typed results; bad input raises `UrewriteError` with the one-line message the command
line prints (docs/api.md).

    from urewrite.api import rewrite, run, read_counts
    done = rewrite("app", "app.probed", probes=["handle_*"], returns=["parse"])
    ran = run(["./app.probed", "--quick"])
    ran.hits("handle_request")

A build script (Python, Meson's `run_command`, an SCons Builder) calls `rewrite` in place
of a subprocess of `urewrite`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from urewrite.errors import UrewriteError

__all__ = ["Placed", "Refused", "Rewritten", "ProbeHits", "Counts", "Ran", "rewrite",
           "read_counts", "run", "UrewriteError"]

KINDS = {1: "entry", 2: "return", 3: "usdt", 4: "address"}


@dataclass(frozen=True)
class Placed:
    """A probe at one site: what `urewrite IN ... --json` lists under "probes"."""
    name: str
    kind: str  # entry, return, usdt, address
    address: int
    displaced: int  # bytes moved into its trampoline
    tactic: str  # jump, hop, evict, pun, ...


@dataclass(frozen=True)
class Refused:
    """A site that could not be patched safely, and why."""
    name: str
    address: int
    reason: str


@dataclass(frozen=True)
class Rewritten:
    output: str
    placed: List[Placed]
    refused: List[Refused]
    warnings: List[str]


@dataclass(frozen=True)
class ProbeHits:
    """One probe's hits over the processes read: what `stat --json` lists."""
    object: str
    name: str
    kind: str
    address: int
    hits: int
    histogram: Optional[List[int]] = None  # log2 ns buckets (docs/region.md), if timed


@dataclass(frozen=True)
class Counts:
    probes: List[ProbeHits]
    processes: int
    returns_missed: int = 0
    latency_missed: int = 0
    problems: List[str] = field(default_factory=list)  # region files that could not be read

    def hits(self, name: str, kind: Optional[str] = None) -> int:
        """The hits of every probe named `name` (of that kind, if given)."""
        return sum(p.hits for p in self.probes
                   if p.name == name and (kind is None or p.kind == kind))


@dataclass(frozen=True)
class Ran:
    exit_status: int
    counts: Counts
    programs: list = field(default_factory=list)  # maps of programs built into the probes


def rewrite(input_path: str, output_path: Optional[str] = None, probes: Sequence[str] = (),
            returns: Sequence[str] = (), args: int = 0, keep_going: bool = False,
            tactics: Optional[Sequence[str]] = None, exclude: Sequence[str] = (),
            program: Optional[str] = None) -> Rewritten:
    """`urewrite IN -p ... -r ... -o OUT`; `program`: a probe program (bpftrace's
    language), as `-e`: its probes added, and the program built in."""
    from urewrite.rewriter.pipeline import rewrite as run_rewrite
    output_path = output_path or input_path + ".probed"
    probes, returns, built_in = list(probes), list(returns), None
    if program is not None:
        probes, returns, args, built_in = _with_program(program, input_path, output_path,
                                                        probes, returns, args)
    if not probes and not returns:
        raise UrewriteError("give at least one probe")
    result = run_rewrite(input_path, output_path, probes, keep_going=keep_going,
                         entry_args=args, return_specs=returns,
                         tactics=tuple(tactics) if tactics else None, exclude=list(exclude),
                         built_in=built_in)
    return Rewritten(result.output,
                     [Placed(site.name, KINDS.get(site.kind, str(site.kind)), site.address,
                             p.window.size, p.tactic) for p in result.plans for site in p.sites],
                     [Refused(r.site.name, r.site.address, r.reason) for r in result.refusals],
                     list(result.warnings))


def _with_program(text: str, input_path: str, output_path: str, probes: List[str],
                  returns: List[str], args: int) -> tuple:
    from urewrite.arch import backend_for
    from urewrite.programs import attach, checks, parser
    from urewrite.programs import probes as program_probes
    checked = checks.check(parser.parse(text))
    specs = program_probes.rewrite_specs(checked.program, [input_path, output_path])
    probes += [p for p in specs.entries if p not in probes]
    returns += [r for r in specs.returns if r not in returns]
    args = max(args, min(program_probes.arguments_used(checked.program),
                         attach.MAX_ENTRY_ARGUMENTS))

    def assemble(machine, lowered, offsets):
        return backend_for(machine).program_code(lowered, offsets)
    return probes, returns, args, attach.rewrite_step(checked, [input_path, output_path],
                                                      assemble)


def read_counts(directory: str) -> Counts:
    """The hits the processes left in a region directory (UREWRITE_DIR), added up."""
    from urewrite.trampolines.region_reader import collect
    problems: List[str] = []
    return _counts(collect(directory, problems), problems)


def run(command: Sequence[str]) -> Ran:
    """`urewrite stat -- COMMAND`: runs it with a fresh region directory, waits, and
    gives its exit status and what its probes counted (its output is not captured)."""
    from urewrite.reader.command_run import run_and_collect
    status, regions, problems, programs = run_and_collect(list(command))
    return Ran(status, _counts(regions, problems), programs)


def _counts(regions, problems: List[str]) -> Counts:
    from urewrite.reader.counts import probe_totals
    totals, histograms = probe_totals(regions)
    return Counts([ProbeHits(*key, hits, histograms.get(key)) for key, hits in totals.items()],
                  len({r.pid for r in regions}),
                  sum(r.returns_missed for r in regions),
                  sum(r.latency_missed for r in regions), problems)
