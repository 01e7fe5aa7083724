"""A rewrite through the API: `urewrite IN -p ... -r ... [-e PROGRAM] -o OUT` without
the command line (which calls this too)."""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Union

from urewrite.api.listing import kind_name, tactic_counts, tactic_names
from urewrite.api.results import PlacedProbe, RefusedSite, RewriteResult
from urewrite.errors import UrewriteError

MAX_ARGS = 6  # integer arguments an entry probe's events can record


class NothingToProbe(UrewriteError):
    """Neither probes nor return probes were given (nor named by the program)."""


def rewrite(input: str, output: str, probes: Iterable[str] = (), returns: Iterable[str] = (),
            args: int = 0, keep_going: bool = False,
            tactics: Union[None, str, Iterable[str]] = None, exclude: Iterable[str] = (),
            program: Optional[str] = None, *, call: Optional[str] = None,
            call_area: int = 64,
            progress: Optional[Callable[[str, int], Optional[Callable[[int], None]]]] = None,
            on_note: Optional[Callable[[str], None]] = None,
            keep: Optional[list] = None) -> RewriteResult:
    """Write `output`: `input` with probes at the entries `probes` select (names, globs,
    0xADDRESSES, FUNC+OFFSET, usdt:PROVIDER:NAME) and at the returns of the functions
    `returns` names, recording the first `args` integer arguments at entries. As the
    command line's -p, -r, --args, --keep-going, --tactics, --exclude and -e: `program`
    is a probe program (bpftrace's language) whose probes in the file are added, and
    which is built into them where it can be (no printf()).

    Raises UrewriteError with the line the command line prints: a file that cannot be
    read or rewritten, a site named exactly that cannot be probed (unless
    `keep_going`), a program with an error. Keyword-only, for callers that show
    progress: `progress(label, total)` -> a function called with items done, or None;
    `on_note(text)` for each note as it arises (they are in the result's `notes` too);
    `keep`: a list the file's analysis is appended to, for a caller that ends the
    process without freeing it. `call`: FILE.c:FUNCTION (or FILE.o:FUNCTION), a C
    callback built into every probe (programs/callback.py), each probe with an area of
    `call_area` bytes, as the command line's --call and --call-area."""
    from urewrite.rewriter.pipeline import no_cycle_collection
    from urewrite.rewriter.pipeline import rewrite as run_rewrite

    if not output:
        raise UrewriteError("the output must name a file")
    if not 0 <= args <= MAX_ARGS:
        raise UrewriteError(f"args={args}: from 0 to {MAX_ARGS} arguments can be recorded")
    probes, returns, exclude = list(probes), list(returns), list(exclude)
    chosen = tactic_names(tactics)
    notes: List[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if on_note is not None:
            on_note(text)

    built_in = None
    if program is not None and call is not None:
        raise UrewriteError("give a program or a callback (--call), not both")
    if call is not None:
        built_in = _callback(call, input, output, call_area)
    if program is not None:
        probes, returns, used, checked = _program_probes(program, input, output, probes,
                                                         returns, note)
        args = max(args, min(used, MAX_ARGS))  # (what the program reads, recorded)
        built_in = _built_in(checked, [input, output], note) if not _is_go(input) else \
            note("the program is not built in (Go code runs no probe program yet)")
    if not probes and not returns:
        raise NothingToProbe("no probe to place: give probes or returns")
    with no_cycle_collection():  # (the file's analysis lives until the result is made)
        done = run_rewrite(input, output, probes, keep_going=keep_going, entry_args=args,
                           return_specs=returns, progress=progress, tactics=chosen,
                           exclude=exclude, kept=keep, built_in=built_in)
        placed, windows, keys = [], [], set()
        for plan in done.plans:
            tactic, displaced = plan.tactic, plan.window.size  # (asked once a plan)
            windows.append(tactic)
            for site in plan.sites:
                placed.append(PlacedProbe(site.name, kind_name(site.kind), site.address,
                                          tactic, displaced))
                keys.add(site.probe_key)
        refused = [RefusedSite(r.site.name, kind_name(r.site.kind), r.site.address, r.reason)
                   for r in done.refusals]
        return RewriteResult(done.output, placed, refused, done.warnings, notes, len(keys),
                             tactic_counts(windows))


def _program_probes(text: str, input: str, output: str, probes: list, returns: list, note):
    """The probes and return probes with those the program names in the file added;
    the arguments it reads, and the program checked."""
    from urewrite.programs import checks, parser, probes as program_probes

    program = parser.parse(text)
    checked = checks.check(program)
    specs = program_probes.rewrite_specs(program, [input, output])
    if specs.elsewhere:
        note(f"leaving out the probes of other files: {', '.join(specs.elsewhere)}")
    return (probes + [p for p in specs.entries if p not in probes],
            returns + [r for r in specs.returns if r not in returns],
            program_probes.arguments_used(program), checked)


def _is_go(path: str) -> bool:
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.go_runtime import is_go_program
    return is_go_program(ElfFile.open(path))


def _callback(spec: str, input: str, output: str, area: int):
    """The rewrite's `built_in` for a C callback, built (compiled, checked) before the
    rewrite starts, for the input's machine."""
    from urewrite.programs import callback
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.go_runtime import is_go_program
    elf = ElfFile.open(input)
    if is_go_program(elf):  # (a goroutine's stack leaves a callback too little room)
        raise UrewriteError(f"--call: {input} is a Go program: callbacks do not run in Go "
                            f"code yet")
    return callback.rewrite_step(callback.build(spec, backend_of(elf.machine, "callbacks"),
                                                area), output, input)


def backend_of(machine: int, what: str = "probe programs"):
    """The backend (arch/) of files of `machine`, which builds probe programs' and
    callbacks' code; UrewriteError where there is none."""
    from urewrite.arch import backend_for, machine_name
    backend = backend_for(machine)
    if backend is None:
        raise UrewriteError(f"{what} do not run in {machine_name(machine)} files")
    return backend


def _built_in(checked, paths: List[str], note):
    """The rewrite's `built_in`: the program's file for the output's probes, or a note
    saying why it is not built in (programs/attach.py, rewrite_step)."""
    from urewrite.programs import attach
    return attach.rewrite_step(checked, paths, program_code,
                               lambda why: note(f"the program is not built in ({why}): "
                                                f"load it with urewrite run"), backend_of)


def program_code(machine: int, lowered, offsets):
    """A lowered program's machine code for files of `machine` (the backend's)."""
    return backend_of(machine).program_code(lowered, offsets)
