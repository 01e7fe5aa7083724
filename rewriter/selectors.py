"""Turns probe specs (-p NAME, -p 'GLOB*', -p 0xADDR, -p NAME+OFFSET, -p usdt:PROVIDER:NAME)
into sites."""

from __future__ import annotations

import bisect
import difflib
import fnmatch
import re
from typing import List, Optional

from urewrite.arch.base import value_class
from urewrite.errors import UrewriteError
from urewrite.rewriter import demangle
from urewrite.rewriter.functions import Function, containing
from urewrite.rewriter.usdt import UsdtSite
from urewrite.trampolines.region import KIND_ADDRESS, KIND_ENTRY, KIND_RETURN, KIND_USDT


@value_class
class Site:
    function: Function
    address: int
    kind: int
    name: str
    spec: str  # what the user wrote
    exact: bool  # named exactly (a refusal is an error) rather than by a glob
    semaphore: int = 0  # USDT: address of the probe's semaphore, 0 if none
    arguments: str = ""  # USDT: sdt.h argument specs
    redirect: bool = False  # return probe: counted by a stub its entry redirects the return to
    tail_call: bool = False  # return probe: an exit that jumps to another function, whose
    #                          return value is not known yet there (its event carries none)
    # return probe, at an indirect jump: [start, end) ranges its target may land in and
    # stay in the function; the exit counts only when the target is in none of them
    stays_within: tuple = ()

    def at_exit(self, address: int, tail_call: bool, stays_within: tuple) -> "Site":
        """This return probe's site at one exit of its function: replace(), quicker (a
        big file's return probes have 100,000s of exits; replace() checks every field)."""
        return Site(self.function, address, self.kind, self.name, self.spec, self.exact,
                    self.semaphore, self.arguments, self.redirect, tail_call, stays_within)

    @property
    def at_entry(self) -> bool:
        return (self.kind in (KIND_ENTRY, KIND_ADDRESS) or self.redirect) \
            and self.address == self.function.address

    @property
    def probe_key(self):
        """Sites with one key count into one probe: all sites of a USDT probe name,
        all exits of a return probe."""
        if self.kind == KIND_USDT:
            return self.name
        if self.kind == KIND_RETURN:
            return ("return", self.function.address)
        return self.address

    @property
    def probe_address(self) -> int:
        """The address the probe is known by: a return probe's is its function's."""
        return self.function.address if self.kind == KIND_RETURN else self.address


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def _may_be_demangled(spec: str) -> bool:
    """Whether a spec that looks like a glob may be a demangled name, looked up as such
    first: C++ and Rust names hold * and [ ] only in types, operators, ABI tags and
    clone suffixes ('app::f(char const*)', 'operator[]', 'f[abi:cxx11]()')."""
    return any(c in spec for c in "(<[") or "operator" in spec


USDT_PREFIX = "usdt:"


def select(specs: List[str], functions: List[Function], boundaries,
           usdt_sites: List[UsdtSite] = (), return_specs: List[str] = (),
           notes: Optional[List[str]] = None, exclude: List[str] = ()) -> List[Site]:
    """Sites for the specs, in address order; one address may carry several probes.

    `boundaries(function)` gives the instruction start addresses of a function. A
    return probe (from `return_specs`: names or globs) is one site at its
    function's address; the planner finds its exits.

    A function probe is named as the user asked (`free`, not its alias
    `__libc_free`; `app::parse`, not `_ZN3app5parseEPKc`); see `_named_sites`.
    `notes` collects a line for each alias named again, which probes nothing more.
    `exclude`: globs that leave out the sites of functions with a name that matches
    (demangled names too), or a USDT site by its usdt:PROVIDER:NAME.
    """
    names = _Names(functions)
    starts = [fn.address for fn in functions]
    sites = {}
    for spec in specs:
        if spec.startswith(USDT_PREFIX):
            for site in _usdt_sites(spec, usdt_sites, functions, starts):
                sites.setdefault((site.address, site.probe_key), site)
            continue
        if spec.lower().startswith("0x"):
            site = _address_site(spec, functions, starts, boundaries)
            sites.setdefault((site.address, site.probe_key), site)
            continue
        offset = _OFFSET.fullmatch(spec) if spec not in names.by_symbol else None
        if offset:  # FUNC+OFFSET, as perf probe and bpftrace write an address in a function
            site = _offset_site(spec, offset.group(1), int(offset.group(2), 0), names,
                                functions, starts, boundaries)
            sites.setdefault((site.address, site.probe_key), site)
            continue
        _add_named(sites, _named_sites(spec, names, KIND_ENTRY), notes)
    for spec in return_specs:
        _add_named(sites, _named_sites(spec, names, KIND_RETURN), notes)
    ordered = [sites[k] for k in sorted(sites, key=lambda k: (k[0], str(k[1])))]
    if exclude:
        matchers = [(glob, matcher(glob), _core(glob)) for glob in exclude]
        ordered = [s for s in ordered if not _excluded(s, matchers, names)]
    return ordered


class _Names:
    """A file's function names: its symbols' (`by_symbol`: name -> functions), and on
    first use, what its C++ and Rust symbols demangle to (`demangled`: symbol ->
    demangle.Demangled; `accepted(symbol)`: the names that select it) and an index of
    those (`by_demangled`: name -> functions), each made when first needed (a glob
    that matches a function's display name needs no other)."""

    def __init__(self, functions: List[Function]):
        self.functions = functions
        self.by_symbol = {}
        for fn in functions:
            for name in fn.names:
                self.by_symbol.setdefault(name, []).append(fn)
        self._demangled = None
        self._accepted = {}
        self._by_demangled = None

    @property
    def demangled(self) -> dict:
        if self._demangled is None:
            self._demangled = demangle.demangle_all(self.by_symbol)
        return self._demangled

    def accepted(self, symbol: str) -> tuple:
        """The demangled names that select the symbol's function, the display name
        first; () for a symbol that does not demangle."""
        found = self._accepted.get(symbol)
        if found is None:
            d = self.demangled.get(symbol)
            found = self._accepted[symbol] = demangle.accepted(d) if d else ()
        return found

    @property
    def by_demangled(self) -> dict:
        if self._by_demangled is None:
            self._by_demangled = {}
            for fn in self.functions:
                seen = set()  # (a function's aliases may demangle alike: C1 and C2
                for symbol in fn.names:  # constructors)
                    for name in self.accepted(symbol):
                        if name not in seen:
                            seen.add(name)
                            self._by_demangled.setdefault(name, []).append(fn)
        return self._by_demangled

    def display_matching(self, fn: Function, matches, core: str = "") -> Optional[str]:
        """The display name of the first of the function's symbols with a demangled
        name that `matches`, None if none has. `core`: _core(glob) (a quicker no)."""
        demangled = self.demangled
        for symbol in fn.names:
            d = demangled.get(symbol)
            if d is not None and (matches(d.display) or (
                    _may_start(d, core) and any(map(matches, self.accepted(symbol)[1:])))):
                return d.display
        return None


def _core(glob: str) -> str:
    """What every name a glob matches starts with, cut before its first space or
    bracket: 'uv_*' -> 'uv_', 'app::f [clone*' -> 'app::f', '*::f' -> ''."""
    return re.split(r"[*?\[ (<]", glob, maxsplit=1)[0]


def _may_start(d: demangle.Demangled, core: str) -> bool:
    """Whether a demangled name of the symbol may start with `core` (a _core()): each
    starts as its display name or its full C++ declaration does, up to the end of the
    name (a form without parameters, or without template arguments, is a prefix of
    it; a clone's ends in ' [clone', cut off by _core) or beyond it (Rust's hash)."""
    return not core or d.display.startswith(core[:len(d.display)]) or \
        (d.full is not None and d.full.startswith(core[:len(d.full)]))


def _named_sites(spec: str, names: _Names, kind: int) -> List[Site]:
    """A site per function the name or glob names, under the name that matched.

    A name given exactly: a symbol's name first (as before demangling: the same
    probes, named alike), else a demangled one; each function it names is reported
    under it. A glob matches a function when it matches any of its names: symbols'
    and demangled ones (with and without parameter list); a C++ or Rust function
    that matched by a demangled name is reported under its display name
    (`app::f(int)`), any other under the most public of its names that matched
    (fewest leading underscores: `free` before `__libc_free`), then the first in
    symbol-table order."""
    exact = names.by_symbol.get(spec)
    if exact is None and not spec.startswith(("_Z", "_R")) and \
            (not _is_glob(spec) or _may_be_demangled(spec)):
        exact = names.by_demangled.get(spec) or names.by_demangled.get(_gcc_spelling(spec))
    if exact is not None:
        return [Site(fn, fn.address, kind, spec, spec, exact=True) for fn in exact]
    if not _is_glob(spec):
        raise UrewriteError(f"no function named '{spec}'{_close_matches(spec, names)}")
    matches, core = matcher(spec), _core(spec)  # (10,000 names given: no regex each)
    out = []
    for fn in names.functions:
        name = names.display_matching(fn, matches, core)
        if name is None:
            if not fn.aliases:
                if not matches(fn.name):
                    continue
                name = fn.name
            else:
                symbols = [n for n in fn.names if matches(n)]
                if not symbols:
                    continue
                name = min(symbols, key=lambda n: len(n) - len(n.lstrip("_")))
        out.append(Site(fn, fn.address, kind, name, spec, exact=False))
    if not out:
        raise UrewriteError(f"no function matches '{spec}'")
    return out


def _gcc_spelling(spec: str) -> str:
    """A C++ name as GCC's demangler spells it: templates closed with '> >' (LLVM's
    tools print '>>'), operator>> left as it is."""
    while True:
        spelled = re.sub(r"(?<!operator)>>", "> >", spec)
        if spelled == spec:
            return spec
        spec = spelled


def _close_matches(spec: str, names: _Names) -> str:
    """' (close matches: ...)' for a name no function has: among symbols' names, or
    for a name with `::`, `<` or `(`, among demangled names."""
    pool = names.by_demangled if any(c in spec for c in ":<(") else names.by_symbol
    close = difflib.get_close_matches(spec, list(pool), n=5, cutoff=0.6)
    return f" (close matches: {', '.join(close)})" if close else ""


def _excluded(site: Site, globs: list, names: _Names) -> bool:
    """Whether --exclude leaves the site out (`globs`: (glob, its matcher(), _core())):
    a glob matches a name of its function (any alias, demangled names too), or, for a
    USDT site, its usdt:PROVIDER:NAME; or is one of them (Go's `main.Map[...]`, a name
    with a glob's characters)."""
    fn = site.function
    for glob, matches, core in globs:
        if any(name == glob or matches(name) for name in fn.names) or \
                names.display_matching(fn, matches, core) or \
                (site.kind == KIND_USDT and matches("usdt:" + site.name)):
            return True
    return False


def matcher(glob: str):
    """match(name) for fnmatch.fnmatchcase(name, glob), without its cache lookup on
    each call (-p '*' on a big file asks for 100,000s of names)."""
    return re.compile(fnmatch.translate(glob)).match


def _add_named(sites: dict, new: List[Site], notes: Optional[List[str]]) -> None:
    """One probe per function and kind: a name given exactly takes over from a glob's
    match (its name, and a refusal becomes an error); of two aliases named exactly,
    the first given names the probe."""
    for site in new:
        key = (site.address, site.probe_key)
        old = sites.get(key)
        if old is None or (site.exact and not old.exact):
            sites[key] = site
        elif site.exact and old.name != site.name and notes is not None:
            what = "return probe" if site.kind == KIND_RETURN else "probe"
            notes.append(f"{site.name} is another name of {old.name} (one function at "
                         f"{site.address:#x}): one {what}, reported as {old.name}")


def _usdt_sites(spec: str, usdt_sites: List[UsdtSite], functions, starts) -> List[Site]:
    pattern = spec[len(USDT_PREFIX):]
    if ":" not in pattern:
        raise UrewriteError(f"'{spec}': write usdt:PROVIDER:NAME (globs allowed)")
    matched = [u for u in usdt_sites if fnmatch.fnmatchcase(u.probe, pattern)]
    if not matched:
        names = sorted({u.probe for u in usdt_sites})
        close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.6)
        hint = f" (close matches: {', '.join('usdt:' + c for c in close)})" if close else \
            ("" if names else " (the file has no USDT probes)")
        raise UrewriteError(f"no USDT probe matches '{pattern}'{hint}")
    out = []
    for u in matched:
        k = bisect.bisect_right(starts, u.pc) - 1
        fn = functions[k] if k >= 0 and functions[k].address <= u.pc < functions[k].end else \
            Function(f"usdt_{u.pc:x}", u.pc, 0, "usdt")
        out.append(Site(fn, u.pc, KIND_USDT, u.probe, spec, exact=not _is_glob(pattern),
                        semaphore=u.semaphore, arguments=u.arguments))
    return out


_OFFSET = re.compile(r"(.*[^+\s])\+(0[xX][0-9a-fA-F]+|[0-9]+)")


def _offset_site(spec: str, name: str, offset: int, names, functions, starts,
                 boundaries) -> Site:
    """The site `offset` bytes into the one function `name` names."""
    found = {site.function.address: site.function
             for site in _named_sites(name, names, KIND_ENTRY)}
    if len(found) != 1:
        raise UrewriteError(f"'{spec}': {name} names {len(found)} functions; an offset needs one")
    fn, = found.values()
    if offset >= max(fn.end - fn.address, 1):
        raise UrewriteError(f"'{spec}': {fn.name} is {fn.end - fn.address} byte(s) long")
    site = _address_site(hex(fn.address + offset), functions, starts, boundaries)
    return Site(site.function, site.address, site.kind, site.name, spec, exact=True)


def _address_site(spec: str, functions, starts, boundaries) -> Site:
    try:
        address = int(spec, 16)
    except ValueError:
        raise UrewriteError(f"'{spec}' is not a hexadecimal address")
    fn = containing(functions, starts, address)
    if fn is None:
        raise UrewriteError(f"address {address:#x} is not inside a known function")
    if address == fn.address:
        return Site(fn, address, KIND_ENTRY, fn.name, spec, exact=True)
    if address not in boundaries(fn):
        raise UrewriteError(f"address {address:#x} is not the start of an instruction in {fn.name}")
    return Site(fn, address, KIND_ADDRESS, f"{fn.name}+{address - fn.address:#x}", spec, exact=True)
