"""Turns probe specs (-p NAME, -p 'GLOB*', -p 0xADDR) into sites."""

from __future__ import annotations

import bisect
import difflib
import fnmatch
from dataclasses import dataclass
from typing import List

from urewrite.errors import UrewriteError
from urewrite.rewriter.functions import Function
from urewrite.trampolines.region import KIND_ADDRESS, KIND_ENTRY


@dataclass(frozen=True)
class Site:
    function: Function
    address: int
    kind: int
    name: str
    spec: str  # what the user wrote
    exact: bool  # named exactly (a refusal is an error) rather than by a glob

    @property
    def at_entry(self) -> bool:
        return self.address == self.function.address


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def select(specs: List[str], functions: List[Function], boundaries) -> List[Site]:
    """Sites for the specs, in address order, each address once.

    `boundaries(function)` gives the instruction start addresses of a function.
    """
    by_name = {}
    for fn in functions:
        for name in fn.names:
            by_name.setdefault(name, []).append(fn)
    starts = [fn.address for fn in functions]
    sites = {}
    for spec in specs:
        if spec.lower().startswith("0x"):
            site = _address_site(spec, functions, starts, boundaries)
            sites.setdefault(site.address, site)
            continue
        if _is_glob(spec):
            matched = [fn for name, fns in by_name.items() if fnmatch.fnmatchcase(name, spec)
                       for fn in fns]
            if not matched:
                raise UrewriteError(f"no function matches '{spec}'")
        else:
            matched = by_name.get(spec)
            if not matched:
                close = difflib.get_close_matches(spec, list(by_name), n=5, cutoff=0.6)
                hint = f" (close matches: {', '.join(close)})" if close else ""
                raise UrewriteError(f"no function named '{spec}'{hint}")
        for fn in matched:
            sites.setdefault(fn.address, Site(fn, fn.address, KIND_ENTRY, fn.name, spec,
                                              exact=not _is_glob(spec)))
    return [sites[a] for a in sorted(sites)]


def _address_site(spec: str, functions, starts, boundaries) -> Site:
    try:
        address = int(spec, 16)
    except ValueError:
        raise UrewriteError(f"'{spec}' is not a hexadecimal address")
    k = bisect.bisect_right(starts, address) - 1
    fn = functions[k] if k >= 0 else None
    if fn is None or not fn.address <= address < max(fn.end, fn.address + 1):
        raise UrewriteError(f"address {address:#x} is not inside a known function")
    if address == fn.address:
        return Site(fn, address, KIND_ENTRY, fn.name, spec, exact=True)
    if address not in boundaries(fn):
        raise UrewriteError(f"address {address:#x} is not the start of an instruction in {fn.name}")
    return Site(fn, address, KIND_ADDRESS, f"{fn.name}+{address - fn.address:#x}", spec, exact=True)
