"""What `stat` prints: the table (or JSON) of hits per probe, latency histograms, and
the lines on stderr. No click here unless there is something to say on stderr:
`stat -- COMMAND` (entry.py) runs and reports without loading the command line."""

from __future__ import annotations

import sys
from itertools import compress
from typing import List, Optional

from urewrite.errors import UrewriteError
from urewrite.reader.counts import TableRows, histogram_buckets, probe_totals


def run_command(command: List[str], as_json: bool, output: Optional[str],
                latency: bool = False) -> int:
    """`stat [--json] [-o FILE] [--latency] -- COMMAND`: run it (or take it over, started
    early), read its regions, report; the exit status."""
    import gc
    from urewrite.reader.command_run import run_and_collect
    from urewrite.sink import Sink
    # tens of thousands of rows made and dropped, no cycles: 2 ms of collections saved
    gc.disable()
    sink = Sink(output, sys.stdout)
    prepared = None if as_json else PreparedRows()
    try:
        exit_code, regions, problems, programs = run_and_collect(command, latency, prepared)
    except UrewriteError as e:
        _say(f"urewrite: {e}")
        return 127
    return finish(exit_code, regions, problems, as_json, sink, programs=programs,
                  prepared=prepared)


def finish(exit_code: int, regions, problems: List[str], as_json: bool, sink,
           every_line: bool = False, directory: Optional[str] = None,
           programs: Optional[list] = None, prepared: Optional[PreparedRows] = None) -> int:
    """The report to `sink` (each JSON object on one line with `every_line`), what was
    skipped or missed on stderr; the exit status. `programs`: the maps of programs
    built into the probes (reader/probe_programs.built_in_maps), else read from
    `directory`."""
    for problem in problems:
        _say(f"urewrite: warning: skipped {problem}")
    if programs is None and directory is not None:
        from urewrite.reader.command_run import built_in_maps_in
        programs = built_in_maps_in(directory)
    text = report(exit_code, regions, as_json, programs or [], prepared)
    if as_json and every_line:
        import json
        text = json.dumps(json.loads(text)) + "\n"
    sink.write(text)
    sink.close()
    if not regions:
        _say(f"urewrite: no probe region in {directory}" if directory else
             "urewrite: no probe region was written: is the command rewritten by urewrite "
             "(and not set-user-ID)?")
    say_missed(regions)
    return exit_code or 0


def report_saying_missed(exit_code: int, regions, as_json: bool, programs=()) -> str:
    """stat -p's report: report()'s, and on stderr what went uncounted, as stat of a
    command says it."""
    say_missed(regions)
    return report(exit_code, regions, as_json, programs)


def say_missed(regions) -> None:
    from urewrite.trampolines import region as region_layout
    for who, returns_missed, latency_missed in _missed_by_object(regions):
        if returns_missed:
            _say(f"urewrite: {who}: {returns_missed} calls could not redirect their "
                 f"return address: their returns are not counted")
        if latency_missed:
            _say(f"urewrite: {who}: {latency_missed} returns of functions measured for "
                 f"latency gave no sample (more than {region_layout.LATENCY_DEPTH} calls "
                 f"open in a thread, or entered on another thread; Go functions: more "
                 f"calls open than the region's {region_layout.GO_CALLS} entries hold, or "
                 f"run with no goroutine)")


def _say(message: str) -> None:
    import click  # (only when there is something to say)
    click.echo(message, err=True)


class PreparedRows:
    """The table's rows as far as they are known before the counts: those of each
    probe table read while the command runs (run_and_collect's on_table), formatted
    but for the hits."""

    def __init__(self):
        self.by_table = {}

    def __call__(self, obj: str, table) -> None:
        rows = TableRows(obj, table)
        if not rows.keys:
            return
        wo, wn = _widths(rows.keys)
        prefix = f"%-{wo}s  %-{wn}s  %-7s %#018x "
        prefixes = [prefix % k for k in rows.keys]
        # most probes of a run are never hit (17,000 of python3.11's 20,000 in `-c pass`):
        # their rows are whole already
        unhit = [p + "%12d" % 0 for p in prefixes]
        # (the table kept here: its id, the key, stays its own while this lives)
        self.by_table[id(table)] = (table, rows, _heading(wo, wn), prefixes, unhit)

    def table_lines(self, regions) -> Optional[list]:
        """The table's lines, where the regions are one region with probes whose rows
        are prepared and have no histograms; else None (report() makes them)."""
        shown = [r for r in regions if r.probes or r.hits is not None]
        if len(shown) != 1 or id(shown[0].table) not in self.by_table:
            return None
        region = shown[0]
        _, rows, heading, prefixes, unhit = self.by_table[id(region.table)]
        if region.hits is None and not rows.without_histograms(region.probes):
            return None
        lines = [heading] + unhit
        totals = rows.totals(region.hits if region.hits is not None else
                             [p.hits for p in region.probes])
        for k in compress(range(len(totals)), totals):
            lines[k + 1] = prefixes[k] + "%12d" % totals[k]
        return lines


def _widths(keys) -> tuple:
    """The widths of the OBJECT and PROBE columns for these rows' keys."""
    return (max(6, max(map(len, {k[0] for k in keys}))),
            max(5, max(map(len, [k[1] for k in keys]))))


def _heading(wo: int, wn: int) -> str:
    return f"{'OBJECT':<{wo}}  {'PROBE':<{wn}}  {'KIND':<7} {'ADDRESS':<18} {'HITS':>12}"


def report(exit_code: int, regions, as_json: bool, programs=(),
           prepared: Optional[PreparedRows] = None) -> str:
    """The report of these regions' hits: a table with histograms, or JSON; then the
    maps of the programs built into the probes, as `urewrite run` prints them.
    `prepared`: rows made while the command ran (the same text, sooner)."""
    lines = None if as_json or prepared is None else prepared.table_lines(regions)
    if lines is not None:
        return _with_programs(lines, programs)
    if prepared is not None:
        from urewrite.trampolines.region_reader import probes_made
        regions = [probes_made(r) for r in regions]
    totals, histograms = probe_totals(regions)
    if as_json:
        import json  # (loaded for JSON only: 2 ms of a table report)
        probes = []
        for k, hits in totals.items():
            probe = {"object": k[0], "name": k[1], "kind": k[2], "address": k[3],
                     "hits": hits}
            if k in histograms:
                probe["histogram"] = histogram_buckets(histograms[k])
            probes.append(probe)
        # calls whose return was not seen, and returns that gave no latency sample:
        # never dropped silently (stderr says so too)
        # and whether calls were timed at all (--latency): no histogram says nothing else
        shown = {"exit_code": exit_code, "processes": len({r.pid for r in regions}),
                 "probes": probes,
                 "returns_missed": sum(r.returns_missed for r in regions),
                 "latency_missed": sum(r.latency_missed for r in regions),
                 "calls_timed": any(r.timed for r in regions)}
        if programs:
            from urewrite.programs.output import json_lines
            shown["programs"] = [{"maps": [json.loads(line) for line in json_lines(maps)],
                                  "dropped": dropped, "faults": faults}
                                 for maps, dropped, faults in programs]
        return json.dumps(shown, indent=2) + "\n"
    if not totals:
        return ""
    # (one format for every row: a python3.11 of every function has 17,000 of them)
    wo, wn = _widths(totals)
    row = f"%-{wo}s  %-{wn}s  %-7s %#018x %12d"  # (%: twice as fast as format here)
    lines = [_heading(wo, wn)]
    lines += [row % (obj, name, kind, address, hits)
              for (obj, name, kind, address), hits in totals.items()]
    for k in totals if histograms else ():  # (in the rows' order)
        buckets = histogram_buckets(histograms[k]) if k in histograms else None
        if buckets:
            lines += ["", f"{k[0]}: {k[1]}: latency from entry to return"]
            lines += _histogram_lines(buckets)
    return _with_programs(lines, programs)


def _with_programs(lines: list, programs) -> str:
    """The table's lines, then the maps of the programs built into the probes."""
    for maps, dropped, faults in programs:
        from urewrite.programs.output import text as maps_text
        lines += ["", "the program built into the probes:", "", maps_text(maps).rstrip("\n")]
        if dropped:
            lines.append(f"({dropped} map updates were dropped: a map with keys was full)")
        if faults:
            lines.append(f"({faults} memory reads found nothing to read: they gave \"\" or 0)")
    return "\n".join(lines) + "\n"


def _histogram_lines(buckets, width: int = 40) -> list:
    """A log2 histogram drawn as bcc's funclatency does."""
    top = max(b["count"] for b in buckets)
    lines = [f"{'nsecs':>22} : {'count':<10} distribution"]
    for b in buckets:
        bar = "*" * round(width * b["count"] / top) if top else ""
        lines.append(f"{b['lo_ns']:>10} -> {b['hi_ns'] - 1:<10} : {b['count']:<10} "
                     f"|{bar:<{width}}|")
    return lines


def _missed_by_object(regions):
    """(who, returns missed, latency samples missed) per object, over its processes: one
    line for a loop of short runs, not one per process."""
    by_object = {}
    for region in regions:
        pids, returns, latency = by_object.get(region.object, ([], 0, 0))
        by_object[region.object] = (pids + [region.pid], returns + region.returns_missed,
                                    latency + region.latency_missed)
    for name, (pids, returns, latency) in by_object.items():
        who = f"{name} (pid {pids[0]})" if len(pids) == 1 else f"{name} ({len(pids)} processes)"
        yield who, returns, latency
