"""What a file offers to probe: every function entry and USDT site with its plan or
refusal, and every function's return probe (the planner's verdicts, nothing written).
`list_sites` gives them typed; `site_rows` as the dicts `urewrite list --json` writes,
which the command line streams (it encodes a big file's rows while the return probes
are planned)."""

from __future__ import annotations

import json
from typing import Iterable, Optional, Union

from urewrite.api.results import FunctionSite, Listing, ReturnProbe, UsdtSite
from urewrite.errors import UrewriteError


def tactic_names(value: Union[None, str, Iterable[str]]) -> Optional[tuple]:
    """"hop,jump" (or ["hop", "jump"]) -> ("jump", "hop"): the chosen tactics, tried in
    their fixed order; None: all of them."""
    if value is None:
        return None
    from urewrite.rewriter.plan.tactics import TACTICS
    names = value.split(",") if isinstance(value, str) else list(value)
    chosen = [t.strip() for t in names if t.strip()]
    unknown = [t for t in chosen if t not in TACTICS]
    if unknown:
        raise UrewriteError(f"unknown tactic {unknown[0]!r} (choose from {', '.join(TACTICS)})")
    if not chosen:
        raise UrewriteError("name a tactic")
    return tuple(t for t in TACTICS if t in chosen)


def tactic_counts(tactics) -> dict:
    """How many times each tactic occurs in `tactics` (one per patched window), every
    tactic named."""
    from urewrite.rewriter.plan.tactics import TACTICS
    counts = dict.fromkeys(TACTICS, 0)
    for tactic in tactics:
        counts[tactic] += 1
    return counts


def kind_name(kind: int) -> str:
    from urewrite.trampolines.region import KIND_NAMES
    return KIND_NAMES[kind]


def list_sites(path: str, tactics: Union[None, str, Iterable[str]] = None,
               patchable: bool = False) -> Listing:
    """What `urewrite list --json PATH` shows (`patchable`: only the sites that can be
    probed; `tactics`: the patch tactics to try, as --tactics)."""
    from urewrite.rewriter.pipeline import no_cycle_collection

    with no_cycle_collection():  # (the file's analysis is alive meanwhile)
        _, functions, usdt, add_returns = site_rows(path, tactic_names(tactics), patchable)
        add_returns()
    return Listing(path,
                   [FunctionSite(**{k: v for k, v in row.items() if k != "return"},
                                 return_probe=ReturnProbe(**row["return"]))
                    for row in functions],
                   [UsdtSite(**row) for row in usdt])


def list_rows(input_file: str, tactics, patchable: bool = False, progress=None):
    """The rows `list` shows: (functions, USDT sites), each with its plan or refusal."""
    from urewrite.rewriter.pipeline import no_cycle_collection

    with no_cycle_collection():  # (the rows too: the file's analysis is still alive)
        _, functions, probes, add_returns = site_rows(input_file, tactics, patchable, progress,
                                                      names=False)
        add_returns()
        return functions, probes


def site_rows(input_file: str, tactics, patchable: bool = False, progress=None,
              encoded: bool = False, names: bool = True) -> tuple:
    """(analysis, functions, USDT sites, add_returns): the rows `list` shows, each with
    its plan or refusal; add_returns() gives each function's row its "return", last
    (`encoded`: in JSON): it waits for the return probes, planned in another process
    meanwhile (the caller may write the rest of the rows first). Call it with the
    cyclic collector paused (no_cycle_collection): the file's analysis is alive.
    `names`: each row's "demangled" names too (--summary counts without them)."""
    from urewrite.rewriter.pipeline import list_sites as planned_sites
    from urewrite.rewriter.plan.results import Plan
    from urewrite.trampolines.region import KIND_RETURN, KIND_USDT

    analysis, outcomes, returns = planned_sites(
        input_file, tactics, progress, encoded_returns if encoded else return_rows)
    split_off = analysis.planner.model.fragments()
    demangled = demangled_names(analysis.functions) if names else {}
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


def demangled_names(functions) -> dict:
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


def return_rows(found: dict) -> dict:
    """Function address -> the "return" of its row, from its return probe (in the child
    process that plans them, while this one lists the entries)."""
    return {address: return_row(probe) for address, probe in found.items()}


def encoded_returns(found: dict) -> dict:
    """return_rows() in JSON, each different value encoded once (node's 78,000 are 900
    different ones) and sent as one object (in the child, as return_rows(): these took
    0.8 s of the parent's time after the child ended)."""
    seen, encoded = {}, {}
    for address, probe in found.items():
        key = (probe.redirected, probe.refusal, probe.exits, tuple(probe.tactics.items()),
               probe.checked, probe.redirected_because)
        value = seen.get(key)
        if value is None:
            value = seen[key] = json.dumps(return_row(probe))
        encoded[address] = value
    return encoded


def return_row(probe) -> dict:
    """How a return probe of a function would work (mechanism None: refused)."""
    mechanism = "redirection" if probe.redirected else None if probe.refusal else "exit sites"
    return {"mechanism": mechanism, "exits": probe.exits, "tactics": probe.tactics,
            "checked": probe.checked, "reason": probe.refusal or probe.redirected_because}
