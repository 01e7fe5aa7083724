"""The commands: `urewrite IN -p ... -o OUT`, `urewrite list`, `urewrite stat`.

Exit status: 0 success; 1 bad input or a probe that cannot be placed; 2 bad
usage. `stat` passes through the exit status of the command it ran (128+N when
a signal N ended it; 127 when it cannot be started).
"""

from __future__ import annotations

import json
import os
import sys

import click

from urewrite import __version__
from urewrite.errors import UrewriteError
from urewrite.live_options import live_options, live_or_command
from urewrite.long_options import LongOptionsCommand

EXIT_ERROR = 1
NAME_COLUMN = 48  # characters, at most, `list` aligns names to


class _DefaultToRewrite(click.Group):
    """`urewrite IN ...` means `urewrite rewrite IN ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["rewrite"] + list(args)
        return super().parse_args(ctx, args)


def _fail(message: str) -> None:
    click.echo(f"urewrite: {message}", err=True)
    sys.exit(EXIT_ERROR)


_OWNS_PROCESS = False  # set by run(): the process ends with the command


def run() -> None:
    """The program (console script, `python -m urewrite`): main(), whose commands may
    end the process at once (_end_now)."""
    global _OWNS_PROCESS
    _OWNS_PROCESS = True
    main(prog_name="urewrite")


def _end_now(_kept=None) -> None:
    """End the process (status 0) without freeing what it made (such as `_kept`), when
    it is the program run(): a big file's analysis is millions of objects, and freeing
    them one by one took 0.5 s of node's `list`. Under another caller (tests), just
    return."""
    if _OWNS_PROCESS:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            return  # (the usual exit reports it)
        os._exit(0)


def _print_share_dir(kind: str):
    """An eager option that prints the folder of the build-system files shipped in the package."""
    def callback(ctx, _param, value):
        if not value or ctx.resilient_parsing:
            return
        click.echo(os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", kind))
        ctx.exit()
    return callback


@click.group(cls=_DefaultToRewrite, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="urewrite")
@click.option("--cmake-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_share_dir("cmake"),
              help="Print the folder of urewrite's CMake package (urewriteConfig.cmake) and exit.")
@click.option("--bazel-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_share_dir("bazel"),
              help="Print the folder of urewrite's Bazel rules (a local_repository) and exit.")
def main():
    """Pre-instrument ELF programs and libraries (x86_64, arm64) with trap-free probes.

    \b
      urewrite list app                       what can be probed, and how
      urewrite app -p handle_request -r parse -p usdt:app:query -o app.probed
      urewrite stat -- ./app.probed ARGS      run it, print hits per probe (and latencies)
      urewrite trace -- ./app.probed ARGS     run it, print every hit with its arguments
    Exit status: 0 success, 1 bad input or a probe that cannot be placed, 2 bad usage;
    stat and trace pass on the command's own.
    """


@main.command(cls=LongOptionsCommand)
@click.argument("input_file", metavar="IN", type=click.Path())  # a directory: one line, exit 1
@click.option("-p", "--probe", "probes", multiple=True, metavar="SPEC",
              help="Function name, glob ('parse_*') or address (0x401136) to probe at entry, "
                   "or a USDT probe: usdt:PROVIDER:NAME (globs allowed). Repeatable.")
@click.option("-o", "--output", metavar="OUT", help="Output file [default: IN.probed].")
@click.option("-r", "--return", "returns", multiple=True, metavar="FUNC",
              help="Function name or glob to probe at every return (and tail call); return "
                   "events carry the return value. Repeatable.")
@click.option("--args", "arg_count", type=click.IntRange(0, 6), default=0, metavar="N",
              help="Record the first N integer arguments of function-entry probes in events "
                   "(urewrite trace); a Go function's in Go's convention (list shows it). "
                   "USDT probes record their own arguments.")
@click.option("--keep-going", is_flag=True,
              help="Skip sites that cannot be patched safely even when named exactly.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--tactics", callback=lambda _c, _p, v: _parse_tactics(v), default=None,
              metavar="LIST", help="Patch tactics to try, in order, from jump,hop,evict,pun "
                                   "[default: all].")
@click.option("--exclude", "excludes", multiple=True, metavar="GLOB",
              help="Leave out functions with a name (or USDT probes, usdt:P:N) matching GLOB, "
                   "whatever selected them. Repeatable.")
@click.option("-e", "program_text", metavar="PROGRAM",
              help="Probe what a probe program (bpftrace's language) names in IN: its "
                   "uprobe, uretprobe and usdt probes whose path is IN, OUT, their basename "
                   "or '*'.")
@click.option("-f", "program_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="The same, with the program read from FILE.")
def rewrite(input_file, probes, returns, output, arg_count, keep_going, as_json, quiet, tactics,
            excludes, program_text, program_file):
    """Write a copy of IN with probes at the given sites.

    A site that cannot be patched safely is refused with the reason: an error
    when named exactly (unless --keep-going), a warning when matched by a glob.
    """
    from urewrite.rewriter.pipeline import no_cycle_collection
    from urewrite.rewriter.pipeline import rewrite as run_rewrite

    if output == "":
        raise click.BadParameter("must name a file", param_hint="-o")
    output = output if output is not None else input_file + ".probed"
    if program_text is not None or program_file is not None:
        probes, returns, used = _program_probes(program_text, program_file, input_file, output,
                                                probes, returns, quiet)
        arg_count = max(arg_count, min(used, 6))  # what the program reads, recorded
    if not probes and not returns:
        raise click.UsageError("give at least one probe with -p or -r")
    with no_cycle_collection():  # (the file's analysis lives until the report is written)
        kept = []  # (the analysis, which _end_now() does not free)
        try:
            result = run_rewrite(input_file, output, list(probes), keep_going=keep_going,
                                 entry_args=arg_count, return_specs=list(returns),
                                 progress=None if quiet else _progress_bar,
                                 tactics=tactics, exclude=list(excludes), kept=kept)
        except UrewriteError as e:
            _fail(str(e))
        _report_rewrite(result, output, as_json, quiet)
        _end_now((kept, result))


def _program_probes(text, path, input_file, output, probes, returns, quiet):
    """-p and -r with the probes a program (-e or -f) names in the file added."""
    from urewrite.programs import checks, parser, probes as program_probes

    if text is not None and path is not None:
        raise click.UsageError("give the program with -e or with -f, not both")
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            _fail(f"cannot read the program {path}: {getattr(e, 'strerror', None) or e}")
    try:
        program = parser.parse(text)
        checks.check(program)
        specs = program_probes.rewrite_specs(program, [input_file, output])
    except UrewriteError as e:
        _fail(str(e))
    if specs.elsewhere and not quiet:
        click.echo(f"urewrite: note: leaving out the probes of other files: "
                   f"{', '.join(specs.elsewhere)}", err=True)
    return (list(probes) + [p for p in specs.entries if p not in probes],
            list(returns) + [r for r in specs.returns if r not in returns],
            program_probes.arguments_used(program))


def _report_rewrite(result, output: str, as_json: bool, quiet: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "output": result.output,
            "probes": [{"name": site.name, "kind": _kind(site.kind), "address": site.address,
                        "displaced": p.window.size, "tactic": p.tactic}
                       for p in result.plans for site in p.sites],
            "tactics": _tactic_counts(p.tactic for p in result.plans),
            # (a return probe lists one entry per exit it patched, at the exit's address)
            "refused": [{"name": r.site.name, "address": r.site.address, "reason": r.reason}
                        for r in result.refusals],
        }, indent=2))
        return
    if not quiet:
        for warning in result.warnings:
            click.echo(f"urewrite: warning: {warning}", err=True)
        for r in result.refusals:  # (a function's entry and return may both be refused)
            what = f"the return of {r.site.name}" if _kind(r.site.kind) == "return" \
                else r.site.name
            click.echo(f"urewrite: warning: not probing {what}: {r.reason}", err=True)
        refused = f", {len(result.refusals)} refused" if result.refusals else ""
        probes = len({site.probe_key for p in result.plans for site in p.sites})
        sites = sum(len(p.sites) for p in result.plans)  # (adjacent ones may share a window)
        click.echo(f"urewrite: wrote {output}: {probes} probes at {sites} sites"
                   f"{refused}", err=True)


def _parse_tactics(value):
    """--tactics hop,jump -> ("jump", "hop"): the chosen ones, tried in their fixed order."""
    if value is None:
        return None
    from urewrite.rewriter.plan.tactics import TACTICS
    chosen = [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TACTICS]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown tactic {unknown[0]!r} (choose from "
                                 f"{', '.join(TACTICS)})" if unknown else "name a tactic",
                                 param_hint="--tactics")
    return tuple(t for t in TACTICS if t in chosen)


def _tactic_counts(tactics) -> dict:
    """How many times each tactic occurs in `tactics` (one per patched window), every
    tactic named."""
    from urewrite.rewriter.plan.tactics import TACTICS
    counts = dict.fromkeys(TACTICS, 0)
    for tactic in tactics:
        counts[tactic] += 1
    return counts


def _tactic_note(tactics: dict, checked: int = 0) -> str:
    """' (2 by hop)' for exits patched by other tactics than the plain jump; ' (1 by
    hop, 3 checked)' when some are indirect jumps counted only when they leave."""
    other = [f"{n} by {t}" for t, n in sorted(tactics.items()) if t != "jump"]
    other += [f"{checked} checked"] if checked else []
    return f" ({', '.join(other)})" if other else ""


def _kind(kind: int) -> str:
    from urewrite.trampolines.region import KIND_NAMES
    return KIND_NAMES[kind]


def _progress_bar(label: str, total: int):
    """A progress bar on stderr for a long step (a few thousand items take a second or
    more), when stderr is a terminal: the step function to call as items are done."""
    if total < 2000 or not sys.stderr.isatty():
        return None
    bar = click.progressbar(length=total, label=label, file=sys.stderr)
    bar.__enter__()
    done = [0]

    def step(n: int) -> None:
        bar.update(n)
        done[0] += n
        if done[0] >= total:
            bar.__exit__(None, None, None)
    return step


def _list_rows(input_file: str, tactics, patchable: bool = False, progress=None):
    """The rows `list` shows: (functions, USDT sites), each with its plan or refusal."""
    from urewrite.rewriter.pipeline import no_cycle_collection

    with no_cycle_collection():  # (the rows too: the file's analysis is still alive)
        _, functions, probes, add_returns = _listing(input_file, tactics, patchable, progress,
                                                     names=False)
        add_returns()
        return functions, probes


def _listing(input_file: str, tactics, patchable: bool = False, progress=None,
             encoded: bool = False, names: bool = True) -> tuple:
    """(analysis, functions, USDT sites, add_returns): the rows `list` shows, each with
    its plan or refusal; add_returns() gives each function's row its "return", last
    (`encoded`: in JSON): it waits for the return probes, planned in another process
    meanwhile (the caller may write the rest of the rows first). Call it with the
    cyclic collector paused (no_cycle_collection): the file's analysis is alive.
    `names`: each row's "demangled" names too (--summary counts without them)."""
    from urewrite.rewriter.pipeline import list_sites
    from urewrite.rewriter.plan.results import Plan
    from urewrite.trampolines.region import KIND_RETURN, KIND_USDT

    analysis, outcomes, returns = list_sites(
        input_file, tactics, progress, _encoded_returns if encoded else _return_rows)
    split_off = analysis.planner.model.fragments()
    demangled = _demangled_names(analysis.functions) if names else {}
    conventions = _conventions(analysis) if names else None
    functions, probes = [], []
    for o in outcomes:
        ok = isinstance(o, Plan)
        if o.site.kind == KIND_RETURN or (patchable and not ok):
            continue
        status = {"patchable": ok, "displaced": o.window.size if ok else None,
                  "tactic": o.tactic if ok else None, "reason": None if ok else o.reason}
        # every site of a plan: sites a few bytes apart share one window (libjvm's
        # GetVersion__entry and __return, two adjacent 1-byte nops)
        for site in o.sites if ok and len(o.points) + len(o.points[0].sites) > 2 else (o.site,):
            if site.kind == KIND_USDT:
                provider, name = site.name.split(":", 1)
                probes.append({"provider": provider, "name": name, "address": site.address,
                               "semaphore": site.semaphore or None,
                               "arguments": site.arguments, "function": site.function.name,
                               **status})
            else:
                fn = site.function
                functions.append({"name": fn.name, "aliases": list(fn.aliases),
                                  "demangled": demangled.get(fn.address, []),
                                  "address": fn.address, "size": fn.size,
                                  "sized_by": fn.sized_by, "origin": fn.origin,
                                  "split_off": fn.address in split_off or ".cold" in fn.name,
                                  **status, **(conventions(fn) if conventions else {})})
    probes.sort(key=lambda p: p["address"])  # (refused ones come after the plans)

    def add_returns() -> None:
        found = returns()
        for row in functions:
            row["return"] = found[row["address"]]
    return analysis, functions, probes, add_returns


def _conventions(analysis):
    """function -> what its row says of how --args and return values read it, for a Go
    program (its functions do not all use the C ABI); None for any other file."""
    from urewrite.rewriter.go_abi import conventions
    from urewrite.trampolines.arguments import GO_STACK, UNKNOWN

    convention_of = conventions(analysis.elf)
    if convention_of is None:
        return None

    def row(fn) -> dict:
        c = convention_of(fn)
        note = c.why if c.name == UNKNOWN else \
            f"a frame of {c.frame_words} words" if c.name == GO_STACK else None
        return {"convention": c.name, "convention_note": note}
    return row


def _demangled_names(functions) -> dict:
    """Function address -> the display names of its C++ and Rust symbols, each once,
    in symbol-table order (most functions have one, or none)."""
    from urewrite.rewriter.demangle import demangle_all

    found = demangle_all(name for fn in functions for name in fn.names)
    out = {}
    for fn in functions:
        shown = [found[n].display for n in fn.names if n in found]
        if shown:
            out[fn.address] = list(dict.fromkeys(shown))
    return out


def _coverage(functions: list, probes: list) -> dict:
    """What `list --summary` counts for one file: functions, the share of them that
    take an entry and a return probe (parts split off from a function, such as .cold,
    are not functions of their own for returns), USDT sites, and sites per tactic."""
    whole = [f for f in functions if not f["split_off"]]
    tactics = _tactic_counts(
        [row["tactic"] for row in functions + probes if row["patchable"]]
        + [tactic for f in whole for tactic, n in f["return"]["tactics"].items()
           for _ in range(n)])
    return {"functions": len(functions),
            "entry": sum(f["patchable"] for f in functions),
            "return_functions": len(whole),
            "return": sum(f["return"]["mechanism"] is not None for f in whole),
            "usdt_sites": len(probes), "usdt": sum(p["patchable"] for p in probes),
            "tactics": tactics}


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def _file_coverage(job) -> tuple:
    """(the --summary row of one file, None), or (None, why it was skipped)."""
    path, tactics = job
    try:
        return {"file": path, **_coverage(*_list_rows(path, tactics))}, None
    except UrewriteError as e:
        return None, str(e)


def _print_summary(paths, tactics, as_json: bool, quiet: bool = False) -> None:
    """Coverage per file and in total; a file that cannot be read is skipped with a
    warning (a directory scan meets scripts and data), an error only if all are."""
    from urewrite.rewriter import parallel

    rows, skipped = [], []
    bar = click.progressbar(length=len(paths), label="listing", file=sys.stderr) \
        if len(paths) > 1 and sys.stderr.isatty() and not quiet else None
    if bar:
        bar.__enter__()
    # files on all cores, results in the order given
    for path, (row, reason) in zip(paths, parallel.map_ordered(
            _file_coverage, [(path, tactics) for path in paths])):
        if row is not None:
            rows.append(row)
        else:
            skipped.append({"file": path, "reason": reason})
        if bar:
            bar.update(1)
    if bar:
        bar.__exit__(None, None, None)
    if not rows:
        _fail(skipped[0]["reason"] if len(skipped) == 1 else
              f"none of the {len(skipped)} files could be read: {skipped[0]['reason']}")
    for s in skipped:
        click.echo(f"urewrite: warning: skipped {s['file']}: {s['reason']}", err=True)
    total = {"files": len(rows)}
    for key in ("functions", "entry", "return_functions", "return", "usdt_sites", "usdt"):
        total[key] = sum(r[key] for r in rows)
    total["tactics"] = {t: sum(r["tactics"][t] for r in rows) for t in rows[0]["tactics"]}
    if as_json:
        click.echo(json.dumps({"files": rows, "total": total, "skipped": skipped}, indent=2))
        return
    width = max(len(r["file"]) for r in rows + [{"file": "TOTAL"}])
    names = list(total["tactics"])
    click.echo(f"{'FILE':<{width}}  {'FUNCTIONS':>9}  {'ENTRY':>8}  {'RETURN':>8}  "
               f"{'USDT':>9}  " + "  ".join(f"{t.upper():>7}" for t in names))
    for r in rows + [dict(total, file="TOTAL")]:
        click.echo(f"{r['file']:<{width}}  {r['functions']:>9}  "
                   f"{_percent(r['entry'], r['functions']):>8}  "
                   f"{_percent(r['return'], r['return_functions']):>8}  "
                   f"{str(r['usdt']) + '/' + str(r['usdt_sites']):>9}  "
                   + "  ".join(f"{r['tactics'][t]:>7}" for t in names))


@main.command(name="list")
@click.argument("input_files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path())  # a directory: one line, exit 1 (--summary: skipped)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.option("--patchable", is_flag=True, help="Show only sites that can be probed.")
@click.option("--summary", is_flag=True,
              help="Print coverage per file and in total: entry, return and USDT sites "
                   "that can be probed, and sites per tactic (several FILEs allowed).")
@click.option("--tactics", callback=lambda _c, _p, v: _parse_tactics(v), default=None,
              metavar="LIST", help="Patch tactics to try, from jump,hop,evict,pun [default: all].")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no closing count.")
def list_command(input_files, as_json, patchable, summary, tactics, quiet):
    """Show what FILE offers to probe: every function entry and USDT site,
    with its address and whether it can be probed (how many bytes a patch
    displaces, with which tactic) or why not."""
    if summary:
        _print_summary(input_files, tactics, as_json, quiet)
        return
    if len(input_files) > 1:
        raise click.UsageError("give one FILE, or several with --summary")
    input_file = input_files[0]
    from urewrite.rewriter.pipeline import no_cycle_collection

    with no_cycle_collection():  # (the file's analysis lives until the rows are written)
        try:
            analysis, functions, probes, add_returns = _listing(
                input_file, tactics, patchable, None if quiet else _progress_bar, as_json)
            # each function's row up to its return probe, while that is planned
            if as_json:
                encode = _row_encoder()
                heads = [encode(r) for r in functions]
            else:  # (names aligned to the longest, but to no more than NAME_COLUMN:
                # node has a function with 129 aliases, 33,000 characters)
                width = min(max([len(_names(r)) for r in functions] + [8]), NAME_COLUMN)
                heads = [f"{r['address']:#018x} {r['size']:>6}  {_names(r):<{width}}  "
                         f"{_status(r)}; " for r in functions]
            add_returns()
        except UrewriteError as e:
            _fail(str(e))
        if as_json:
            rows = [_Encoded(_json_with(head, "return", row["return"]))
                    for head, row in zip(heads, functions)]
            del heads
            for piece in _json_rows({"file": input_file, "functions": rows, "usdt": probes}):
                click.echo(piece, nl=False)
        else:
            _print_list(functions, heads, width, probes, quiet)
        _end_now(analysis)


def _print_list(functions: list, heads: list, width: int, probes: list, quiet: bool) -> None:
    """`list` as text: the functions' rows, from their `heads`, then the USDT sites."""
    lines = [f"{'ADDRESS':<18} {'SIZE':>6}  {'FUNCTION':<{width}}  ENTRY PROBE; RETURN PROBE"]
    for head, r in zip(heads, functions):
        ret = r["return"]
        returns = (f"redirects its return address ({ret['reason']})"
                   if ret["mechanism"] == "redirection" else
                   "never returns: reports 0" if ret["mechanism"] and not ret["exits"] else
                   f"patches {ret['exits']} exit{'s' if ret['exits'] != 1 else ''}"
                   f"{_tactic_note(ret['tactics'], ret['checked'])}"
                   if ret["mechanism"] else f"no: {ret['reason']}")
        convention = r.get("convention")
        if convention:  # (a Go program's: not every function uses the C ABI)
            note = r["convention_note"]
            returns += f"; arguments: {convention}" + (f" ({note})" if note else "")
        lines.append(f"{head}return: {returns}")
    for k in range(0, len(lines), 10_000):  # (an echo per row took seconds for node)
        click.echo("\n".join(lines[k:k + 10_000]))
    if probes:
        width = max(len(_printable(f"{p['provider']}:{p['name']}")) for p in probes)
        click.echo(f"\n{'ADDRESS':<18} {'USDT':<{width}}  {'SEMAPHORE':<18}  PROBE  ARGUMENTS")
        for p in probes:
            semaphore = f"{p['semaphore']:#x}" if p["semaphore"] else "-"
            probe = _printable(f"{p['provider']}:{p['name']}")
            click.echo(f"{p['address']:#018x} {probe:<{width}}  {semaphore:<18}  {_status(p)}  "
                       f"{_printable(p['arguments']) or '-'}")
    ok = sum(r["patchable"] for r in functions)
    usdt_ok = sum(p["patchable"] for p in probes)
    if not quiet:
        click.echo(f"{len(functions)} functions, {ok} patchable; {len(probes)} USDT sites, "
                   f"{usdt_ok} patchable", err=True)


def _row_encoder():
    """json.dumps() for many small rows: json's C encoder made once (json.dumps makes
    one for each call, half its time for node's 78,000 rows, on the way to the output);
    json.dumps itself where Python has no C encoder, or one made otherwise."""
    from json import encoder

    try:
        once = encoder.c_make_encoder(None, json.JSONEncoder().default,
                                      encoder.encode_basestring_ascii, None, ": ", ", ",
                                      False, False, True)
    except (TypeError, AttributeError):
        return json.dumps
    return lambda row: "".join(once(row, 0))


class _Encoded(str):
    """A row already in JSON (_json_rows)."""


def _json_with(encoded: str, key: str, value: str) -> str:
    """An object encoded by json.dumps() (never empty) with `key` added last, its
    `value` encoded too."""
    return f"{encoded[:-1]}, {json.dumps(key)}: {value}}}"


def _return_rows(found: dict) -> dict:
    """Function address -> the "return" of its row, from its return probe (in the child
    process that plans them, while this one lists the entries)."""
    return {address: _return_row(probe) for address, probe in found.items()}


def _encoded_returns(found: dict) -> dict:
    """_return_rows() in JSON, each different value encoded once (node's 78,000 are 900
    different ones) and sent as one object (in the child, as _return_rows(): these took
    0.8 s of the parent's time after the child ended)."""
    seen, encoded = {}, {}
    for address, probe in found.items():
        key = (probe.redirected, probe.refusal, probe.exits, tuple(probe.tactics.items()),
               probe.checked, probe.redirected_because)
        value = seen.get(key)
        if value is None:
            value = seen[key] = json.dumps(_return_row(probe))
        encoded[address] = value
    return encoded


def _json_rows(report: dict):
    """The report as JSON, in pieces to write one after the other, a row of its lists
    on each line: json's indented output is written in Python, seconds for the
    100,000s of rows of a big file (and one string of them all, 100 MB more). Rows may
    come encoded (_Encoded)."""
    def row(r) -> str:
        return r if isinstance(r, _Encoded) else json.dumps(r)

    for n, (key, value) in enumerate(report.items()):
        yield f"{',' if n else '{'}\n  {json.dumps(key)}: "
        if not isinstance(value, list) or not value:
            yield json.dumps(value)
            continue
        for k in range(0, len(value), 10_000):
            yield ("[\n    " if k == 0 else ",\n    ") + \
                ",\n    ".join(map(row, value[k:k + 10_000]))
        yield "\n  ]"
    yield "\n}\n"


def _names(row) -> str:
    """A function with its aliases (other symbols at its address), any of which -p
    and -r accept: '__libc_free = free = cfree'; a C++ or Rust function's demangled
    name first: 'app::parse(char const*) = _ZN3app5parseEPKc'."""
    return " = ".join(row["demangled"] + [row["name"]] + row["aliases"])


def _return_row(probe) -> dict:
    """How a return probe of a function would work (mechanism None: refused)."""
    mechanism = "redirection" if probe.redirected else None if probe.refusal else "exit sites"
    return {"mechanism": mechanism, "exits": probe.exits, "tactics": probe.tactics,
            "checked": probe.checked, "reason": probe.refusal or probe.redirected_because}


def _printable(text: str) -> str:
    """A note's string on one row: control characters escaped (a note may hold any)."""
    return text if text.isprintable() else \
        "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _status(row) -> str:
    if not row["patchable"]:
        return f"no: {row['reason']}"
    how = "" if row["tactic"] == "jump" else f" ({row['tactic']})"
    return f"ok, displaces {row['displaced']} bytes{how}"


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE, not stdout.")
@click.option("--interval", type=click.FloatRange(min=0.01), metavar="S",
              help="Also print hits and hits/s per probe every S seconds.")
@click.option("--dir", "directory", metavar="DIR", type=click.Path(file_okay=False),
              help="Read the regions of running processes started with UREWRITE_DIR=DIR "
                   "(instead of a command), until Ctrl-C or --duration.")
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def stat(as_json, output, interval, directory, pids, all_of, duration, command):
    """Run COMMAND, then print the hits of every probe in it; or arm running
    processes (-p, --all) and print their hits when they are disarmed; or read
    the regions of running processes (--dir).

    \b
      urewrite stat -- ./app.probed ARGS
      urewrite stat --interval 1 -- ./app.probed ARGS
      urewrite stat -p 1234 --duration 10 [--interval 1]
      urewrite stat --dir /dev/shm/app --interval 1 --duration 10
    The command's own output is left alone; the exit status is passed through.
    """
    from urewrite import stat_report
    from urewrite.sink import Sink

    if pids is not None or all_of is not None:
        if directory is not None:
            raise click.UsageError("-p and --all go without --dir")
        live_or_command(pids, all_of, duration, command)
        from urewrite.live_report import stat_intervals, stat_live as stat_armed
        sys.exit(stat_armed(pids, all_of, duration, as_json, output, stat_report.report)
                 if interval is None else
                 stat_intervals(pids, all_of, duration, interval, as_json, output,
                                stat_report.report))
    if bool(command) == (directory is not None):
        raise click.UsageError("give a command (after --) or --dir DIR, not both"
                               if command else "give a command (after --), -p PID or --dir DIR")
    if duration is not None and directory is None:
        raise click.UsageError("--duration goes with --dir, -p or --all")
    if interval is None and directory is None:
        sys.exit(stat_report.run_command(list(command), as_json, output))
    from urewrite.live_view import stat_live
    sink = Sink(output, sys.stdout)
    try:
        exit_code, regions, problems = stat_live(list(command), directory, interval,
                                                 duration, as_json, sink)
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        sys.exit(127 if command else EXIT_ERROR)
    sys.exit(stat_report.finish(exit_code, regions, problems, as_json, sink,
                                every_line=interval is not None, directory=directory))


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event (JSON lines).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "perfetto"]), default=None,
              help="text [default], json (as --json), or perfetto: Chrome trace-event JSON "
                   "for ui.perfetto.dev and chrome://tracing (a slice per call of functions "
                   "probed at entry and return).")
@click.option("-o", "--output", metavar="FILE", help="Write the events to FILE, not stdout.")
@click.option("--ring", "ring_entries", type=click.IntRange(16, 1 << 22), default=1 << 16,
              metavar="N", show_default=True,
              help="Events each process can hold before the reader catches up.")
@live_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(as_json, fmt, output, ring_entries, pids, all_of, duration, command):
    """Run COMMAND and print every probe hit as it happens: time, process, thread,
    probe and arguments.

    \b
      urewrite trace -- ./app.probed ARGS
      urewrite trace --json -o events.jsonl -- ./app.probed ARGS
      urewrite trace --format perfetto -o trace.json -- ./app.probed ARGS
      urewrite trace -p 1234 --duration 5
    Events a full ring could not hold are counted and reported at the end. The
    command's own output is left alone; its exit status is passed through.
    """
    from urewrite.tracer import loss_message, run_and_trace

    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree")
    as_json = as_json or fmt == "json"
    live = live_or_command(pids, all_of, duration, command)
    if live:
        from urewrite.live_report import trace_live
    traced = trace_live(pids, all_of, duration) if live else run_and_trace
    out = open(output, "w") if output else sys.stdout
    start = []
    perfetto = None
    if fmt == "perfetto":
        from urewrite.perfetto import PerfettoWriter
        perfetto = PerfettoWriter(out)

    def write(events) -> None:
        if perfetto:
            return perfetto.write(events)
        for e in events:
            if as_json:
                out.write(json.dumps({"ts_ns": e.ts_ns, "pid": e.pid, "tid": e.tid,
                                      "object": e.object, "probe": e.probe, "kind": e.kind,
                                      "args": e.args}) + "\n")
            else:
                start[:] = start or [e.ts_ns]
                args = " ".join(str(a) for a in e.args)
                out.write(f"{(e.ts_ns - start[0]) / 1e9:15.9f} {e.pid:>7} {e.tid:>7}  "
                          f"{e.object}:{e.probe}  {args}".rstrip() + "\n")
        out.flush()

    if not as_json and not perfetto:  # (seconds with nanosecond digits)
        out.write(f"{'TIME(s)':>15} {'PID':>7} {'TID':>7}  PROBE  ARGS\n")
    try:
        exit_code, rings = traced(list(command), ring_entries, write)
    except UrewriteError as e:
        click.echo(f"urewrite: {e}", err=True)
        sys.exit(EXIT_ERROR if live else 127)
    finally:
        if perfetto:
            perfetto.close()
        if output:
            out.close()
    for ring in rings:
        if ring.lost:
            click.echo(loss_message(ring), err=True)
    if not rings:
        click.echo("urewrite: no probe region was written: is the command rewritten by "
                   "urewrite (and not set-user-ID)?", err=True)
    sys.exit(exit_code)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
@click.option("--threads", "threads", default="1", metavar="LIST", show_default=True,
              help="Thread counts for scaling rows, e.g. 1,2,4: every row again with that "
                   "many threads hitting the same probe.")
@click.option("--no-kernel", is_flag=True,
              help="Skip the rows that need root and tracefs (kernel uprobes, bpftrace).")
@click.option("--iterations", type=click.IntRange(1), default=100_000_000, metavar="N",
              show_default=True, help="Calls per run (kernel and BPF rows: N/1000, at least "
                                      "10000).")
@click.option("--repeat", type=click.IntRange(1), default=5, metavar="R", show_default=True,
              help="Runs per row; the median is shown with the spread.")
@click.option("--redis", is_flag=True,
              help="Also benchmark redis-server under redis-benchmark on 127.0.0.1.")
@click.option("--redis-requests", type=click.IntRange(1), default=100_000, metavar="N",
              show_default=True, help="Requests per redis-benchmark test.")
@click.option("--rewrite-scaling", is_flag=True,
              help="Also time rewrites of a generated program with more and more probes.")
@click.option("--functions", type=click.IntRange(1), default=10_000, metavar="N",
              show_default=True,
              help="Functions in the generated program of --rewrite-scaling and --collection.")
@click.option("--no-trigger", is_flag=True,
              help="Skip the trigger bench (with --redis, --rewrite-scaling, --big, "
                   "--collection or --programs).")
@click.option("--plot", metavar="FILE", help="Draw M hits/s per row into FILE (PNG; needs "
                                             "matplotlib).")
@click.option("--big", "big_files", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Also time list, one probe and every function on FILE, with peak "
                   "memory (a big program or library: node, libLLVM). Repeatable.")
@click.option("--collection", is_flag=True,
              help="Also time reading a process's counts (--functions functions probed "
                   "at entry and return) and stat over a loop of short runs.")
@click.option("--python", metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="With --collection: also loops of 'FILE -S -c pass' with every function "
                   "probed (a python3.11), plain, armed and under stat.")
@click.option("--programs", is_flag=True,
              help="Also time probe programs (urewrite run) against the same programs "
                   "under bpftrace (--iterations calls each).")
def bench(as_json, threads, no_kernel, iterations, repeat, redis, redis_requests,
          rewrite_scaling, functions, no_trigger, plot, big_files, collection, python,
          programs):
    """Measure what a probe costs here: urewrite against kernel uprobes.

    \b
      urewrite bench                   build a trigger program, measure, print a table
      urewrite bench --threads 1,2     scaling rows
      urewrite bench --no-kernel       skip the rows that need root and tracefs
    Kernel uprobe events made by the bench are removed on exit, on error and on
    Ctrl-C; no other event is touched.
    """
    from urewrite import bench as bench_module

    try:
        thread_counts = bench_module.parse_threads(threads)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--threads")
    if python and not collection:
        raise click.UsageError("--python goes with --collection")
    if no_trigger and plot:
        raise click.UsageError("--plot draws the trigger bench: drop --no-trigger")
    try:
        result = bench_module.run(iterations, repeat, thread_counts, not no_kernel, redis,
                                  redis_requests, rewrite_scaling, functions, not no_trigger,
                                  big_files, collection, python, programs)
        if plot:
            bench_module.plot(result, plot)
    except UrewriteError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        click.echo("urewrite: bench interrupted", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(bench_module.format_report(result), nl=False)


def _add_live_commands() -> None:
    from urewrite.live_commands import export, top
    from urewrite.program_run import run as run_program
    main.add_command(top)
    main.add_command(export)
    main.add_command(run_program)


_add_live_commands()

if __name__ == "__main__":
    main()
