"""The names people type for C++ and Rust symbols, by the demanglers of those languages.

C++ (Itanium ABI, `_Z...`): GCC's own demangler, `__cxa_demangle` of libstdc++ (the
library keystone and LIEF load already), so names read as gdb, c++filt, perf and
`nm -C` print them. Rust (legacy `_ZN...17h<hash>E` and v0 `_R...`): rustc-demangle,
Rust's own, through the pyderust package, without the hash (it changes with every
build) and without v0's crate disambiguators. Both are pure functions of the symbol:
the same names on every machine, with or without the native module.

A demangled symbol has several names:
- its display name (`Demangled.display`): what `list` shows and what a glob reports:
  C++ with the parameter list, without the return type a template function's mangling
  carries (`app::twice<int>(int)`); Rust as rustc-demangle prints it
  (`<app::Rect as app::Shape>::area`).
- `accepted(d)`: every name that selects the function, the display name first: C++ as
  the demangler prints it (`int app::twice<int>(int)`), without the parameter list
  (`app::twice<int>`, every overload of `app::f`), and without the last template or
  generic arguments (`app::twice`, `rtrial::largest`, every instance); Rust with its
  hash too (`rtrial::work::h0123456789abcdef`), which tells generic instances apart.
A GCC clone (`.isra.0`, `.constprop.0`, `.cold`) is a function of its own: its names
all end in ` [clone .isra.0]` (as gdb shows it), so `app::f` never selects it, as
`-p f` never selects `f.isra.0` in C.
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

from urewrite.errors import UrewriteError


class Demangled(NamedTuple):
    symbol: str
    display: str
    full: Optional[str]  # C++: as the demangler prints it, clone suffixes left out


def demangle_all(symbols: Iterable[str]) -> Dict[str, Demangled]:
    """symbol -> its Demangled, for those of `symbols` that demangle (C++ and Rust)."""
    found = {}
    for symbol in symbols:
        start = symbol[:2]
        if (start == "_Z" or start == "_R") and symbol not in found:
            # (C++ functions straight to _cxx: most of them)
            d = _cxx(symbol) if start == "_Z" and not _may_be_rust_legacy(symbol) \
                else demangle(symbol)
            if d is not None:
                found[symbol] = d
    return found


def demangle(symbol: str) -> Optional[Demangled]:
    """One symbol's Demangled, None when it is no C++ or Rust mangled name."""
    if symbol.startswith("_R") or _may_be_rust_legacy(symbol):
        d = _rust(symbol)
        if d is not None or symbol.startswith("_R"):
            return d
    if symbol.startswith("_Z"):
        return _cxx(symbol)
    return None


def accepted(d: Demangled) -> Tuple[str, ...]:
    """Every name that selects the function, its display name first."""
    return _rust_accepted(d) if d.full is None else _cxx_accepted(d)


# -- Rust ----------------------------------------------------------------------------

def _may_be_rust_legacy(symbol: str) -> bool:
    """A legacy Rust name is a C++ nested name alone (`_ZN...E`, maybe a `.suffix`;
    its path may hold `..`): a C++ function's mangling has its parameter types after
    the E."""
    return symbol.startswith("_ZN") and (symbol.endswith("E") or "E." in symbol)


def _pyderust():
    try:
        import pyderust  # (only for files with Rust or C++ names)
    except ImportError as e:
        raise UrewriteError(f"Rust names need the pyderust package (pip install pyderust): {e}")
    return pyderust


def _rust(symbol: str) -> Optional[Demangled]:
    pyderust = _pyderust()
    try:
        return Demangled(symbol, pyderust.demangle(symbol), None)
    except pyderust.DemangleError:
        return None


def _rust_accepted(d: Demangled) -> Tuple[str, ...]:
    pyderust = _pyderust()
    names = [d.display]
    if d.symbol.startswith("_Z"):  # (v0's full form is every crate's disambiguator)
        names.append(pyderust.demangle(d.symbol, include_hash=True))
    generic = _without_last_arguments(d.display)
    if generic:
        names.append(generic)
    return tuple(dict.fromkeys(names))


# -- C++ -----------------------------------------------------------------------------

# special names (vtables, thunks, guard variables, TLS wrappers, transaction clones):
# no name a user types, so only as the demangler prints them
_SPECIAL = ("_ZT", "_ZG")
_CLONE = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*(?:\.[0-9]+)*")
_QUALIFIERS = (" const", " volatile", " restrict", " &&", " &")


def _cxx(symbol: str) -> Optional[Demangled]:
    head, dot, suffix = symbol.partition(".")
    full = _cxa_demangle(head)
    if full is None:
        return None
    clones = _clones(suffix) if dot else ""
    if clones is None:
        return None  # (not a clone suffix GCC writes: leave the name as it is)
    display = full
    if ">(" in full and not head.startswith(_SPECIAL):  # (a template function's return type)
        split = _split_function(full)
        if split is not None:
            display = split[0] + split[1]
    return Demangled(symbol, display + clones, full)


def _clones(suffix: str) -> Optional[str]:
    """' [clone .isra.0] [clone .cold]' for the suffix 'isra.0.cold'."""
    parts = _CLONE.findall("." + suffix)
    if "".join(parts) != "." + suffix:
        return None
    return "".join(f" [clone {p}]" for p in parts)


def _cxx_accepted(d: Demangled) -> Tuple[str, ...]:
    _, dot, suffix = d.symbol.partition(".")
    clones = _clones(suffix) if dot else ""
    names = [d.display, d.full + clones]
    split = None if d.symbol.startswith(_SPECIAL) else _split_function(d.full)
    if split is not None:
        names.append(split[0] + clones)
        generic = _without_last_arguments(split[0])
        if generic:
            names.append(generic + clones)
    return tuple(dict.fromkeys(names))


def _split_function(full: str) -> Optional[Tuple[str, str]]:
    """(qualified name, parameter list with its qualifiers) of a demangled function,
    without its return type: 'int app::twice<int>(int)' -> ('app::twice<int>', '(int)');
    None for what is no function or does not come apart plainly (a function returning
    a function pointer)."""
    end = len(full)
    stripped = True
    while stripped:
        stripped = False
        for q in _QUALIFIERS:
            if full.endswith(q, 0, end):
                end -= len(q)
                stripped = True
    if end == 0 or full[end - 1] != ")":
        return None
    k = full.rfind("(", 0, end)
    if full.find(")", k, end - 1) >= 0:  # (parentheses in the parameter list: walk back)
        depth, k = 0, -1
        for at in reversed([m.start() for m in _PARENS.finditer(full, 0, end)]):
            depth += 1 if full[at] == ")" else -1
            if depth == 0:
                k = at
                break
    if k <= 0:
        return None
    declared, parameters = full[:k], full[k:]
    # only a template function's mangling has its return type, and its name then ends
    # with the template's arguments
    name = declared[_name_start(declared):] if declared.endswith(">") else declared
    if not name or name.startswith(("(*", "(&", "*", "&")) or \
            (name.endswith(")") and "operator" not in name):
        return None
    return name, parameters


_PARENS = re.compile(r"[()]")
# what _name_start looks at: brackets, spaces, and the word operator
_TOKENS = re.compile(r"[(<\[{]|[)>\]}]| |(?<![A-Za-z0-9_])operator(?![A-Za-z0-9_])")


def _name_start(declared: str) -> int:
    """Where the qualified name starts in 'RETURN-TYPE NAME': after the last space
    outside brackets, before any `operator` (whose symbol or type may hold spaces and
    brackets of its own)."""
    depth = start = 0
    for m in _TOKENS.finditer(declared):
        c = m.group()
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth = max(depth - 1, 0)
        elif c == " ":
            if depth == 0:
                start = m.end()
        elif depth == 0:  # operator
            break
    return start


def _without_last_arguments(name: str) -> Optional[str]:
    """The name without its last template (C++, Rust legacy) or generic (Rust v0:
    '::<T>') arguments, None when it has none: 'app::twice<int>' -> 'app::twice'."""
    if not name.endswith(">"):
        return None
    depth, k = 0, len(name) - 1
    while k >= 0:
        c = name[k]
        depth += c == ">"
        depth -= c == "<"
        if depth == 0:
            break
        k -= 1
    if k <= 0:
        return None
    before = name[:k].rstrip()
    if before.endswith("operator") or before.endswith("-"):  # (operator<=>, operator->)
        return None
    return before[:-2] if before.endswith("::") else before


class _CxxDemangler:
    """libstdc++'s __cxa_demangle, loaded on first use, writing into one buffer that it
    grows as it needs (a malloc and a free for each name took as long as the rest)."""

    def __init__(self):
        try:
            cxx = ctypes.CDLL("libstdc++.so.6")
            libc = ctypes.CDLL("libc.so.6")
        except OSError as e:
            raise UrewriteError(f"C++ names need GCC's C++ runtime, libstdc++.so.6: {e}")
        self._demangle = getattr(cxx, "__cxa_demangle")  # (no name mangling in a class)
        self._demangle.restype = ctypes.c_void_p
        self._demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_int)]
        malloc = libc.malloc
        malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        self._size = ctypes.c_size_t(4096)
        self._buffer = malloc(self._size.value)  # (kept for the process's life)
        if not self._buffer:
            raise MemoryError
        self._size_ref = ctypes.byref(self._size)
        self._status = ctypes.c_int()
        self._status_ref = ctypes.byref(self._status)
        self._lock = threading.Lock()

    def __call__(self, symbol: str) -> Optional[str]:
        with self._lock:
            out = self._demangle(symbol.encode(errors="surrogateescape"), self._buffer,
                                 self._size_ref, self._status_ref)
            if not out or self._status.value != 0:
                return None
            self._buffer = out  # (where it grew to, if it did)
            return ctypes.string_at(out).decode(errors="replace")


_loaded: Optional[_CxxDemangler] = None


def _cxa_demangle(symbol: str) -> Optional[str]:
    global _loaded
    if _loaded is None:
        _loaded = _CxxDemangler()
    return _loaded(symbol)
