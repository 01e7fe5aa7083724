"""`urewrite list`: what each function and USDT site of a file offers, and how it would
be probed (the planner's verdicts, without writing anything); `--summary` for many files."""

from __future__ import annotations

import json
import sys

import click

from urewrite.console import end_now, fail
from urewrite.api.listing import list_rows, site_rows, tactic_counts, tactic_names
from urewrite.errors import UrewriteError

NAME_COLUMN = 48  # characters, at most, `list` aligns names to


def parse_tactics(value):
    """--tactics hop,jump -> ("jump", "hop"): the chosen ones, tried in their fixed order."""
    try:
        return tactic_names(value)
    except UrewriteError as e:
        raise click.BadParameter(str(e), param_hint="--tactics")


def tactic_note(tactics: dict, checked: int = 0) -> str:
    """' (2 by hop)' for exits patched by other tactics than the plain jump; ' (1 by
    hop, 3 checked)' when some are indirect jumps counted only when they leave."""
    other = [f"{n} by {t}" for t, n in sorted(tactics.items()) if t != "jump"]
    other += [f"{checked} checked"] if checked else []
    return f" ({', '.join(other)})" if other else ""


def progress_bar(label: str, total: int):
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


def _coverage(functions: list, probes: list) -> dict:
    """What `list --summary` counts for one file: functions, the share of them that
    take an entry and a return probe (parts split off from a function, such as .cold,
    are not functions of their own for returns), USDT sites, and sites per tactic."""
    whole = [f for f in functions if not f["split_off"]]
    tactics = tactic_counts(
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
        return {"file": path, **_coverage(*list_rows(path, tactics))}, None
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
        fail(skipped[0]["reason"] if len(skipped) == 1 else
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


@click.command(name="list")
@click.argument("input_files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path())  # a directory: one line, exit 1 (--summary: skipped)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.option("--patchable", is_flag=True, help="Show only sites that can be probed.")
@click.option("--summary", is_flag=True,
              help="Print coverage per file and in total: entry, return and USDT sites "
                   "that can be probed, and sites per tactic (several FILEs allowed).")
@click.option("--tactics", callback=lambda _c, _p, v: parse_tactics(v), default=None,
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
            analysis, functions, probes, add_returns = site_rows(
                input_file, tactics, patchable, None if quiet else progress_bar, as_json)
            # each function's row up to its return probe, while that is planned
            if as_json:
                encode = row_encoder()
                heads = [encode(r) for r in functions]
            else:  # (names aligned to the longest, but to no more than NAME_COLUMN:
                # node has a function with 129 aliases, 33,000 characters)
                width = min(max([len(_names(r)) for r in functions] + [8]), NAME_COLUMN)
                heads = [f"{r['address']:#018x} {r['size']:>6}  {_names(r):<{width}}  "
                         f"{_status(r)}; " for r in functions]
            add_returns()
        except UrewriteError as e:
            fail(str(e))
        if as_json:
            rows = [_Encoded(_json_with(head, "return", row["return"]))
                    for head, row in zip(heads, functions)]
            del heads
            for piece in _json_rows({"file": input_file, "functions": rows, "usdt": probes}):
                click.echo(piece, nl=False)
        else:
            _print_list(functions, heads, width, probes, quiet)
        end_now(analysis)


def _print_list(functions: list, heads: list, width: int, probes: list, quiet: bool) -> None:
    """`list` as text: the functions' rows, from their `heads`, then the USDT sites."""
    lines = [f"{'ADDRESS':<18} {'SIZE':>6}  {'FUNCTION':<{width}}  ENTRY PROBE; RETURN PROBE"]
    for head, r in zip(heads, functions):
        ret = r["return"]
        returns = (f"redirects its return address ({ret['reason']})"
                   if ret["mechanism"] == "redirection" else
                   "never returns: reports 0" if ret["mechanism"] and not ret["exits"] else
                   f"patches {ret['exits']} exit{'s' if ret['exits'] != 1 else ''}"
                   f"{tactic_note(ret['tactics'], ret['checked'])}"
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


def row_encoder():
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


def _printable(text: str) -> str:
    """A note's string on one row: control characters escaped (a note may hold any)."""
    return text if text.isprintable() else \
        "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _status(row) -> str:
    if not row["patchable"]:
        return f"no: {row['reason']}"
    how = "" if row["tactic"] == "jump" else f" ({row['tactic']})"
    return f"ok, displaces {row['displaced']} bytes{how}"
