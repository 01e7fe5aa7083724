"""The names people type for Go functions, beside those the binary stores.

The runtime prints a generic instantiation's type arguments as `[...]`
(`main.Map[...]` for `main.Map[go.shape.int,go.shape.int]`), as tracebacks and
pprof show it; and a symbol table names ABI0 assembly functions with a `.abi0`
suffix that .gopclntab, and so a stripped build, does not have.
"""

from __future__ import annotations

from typing import Tuple


def typed_names(name: str) -> Tuple[str, ...]:
    """Other names of the Go function `name`: its generic form, its name without
    `.abi0`; none for most."""
    out = []
    if "[" in name:
        elided = elide_type_arguments(name)
        if elided != name:
            out.append(elided)
    if name.endswith(".abi0"):
        out.append(name[:-len(".abi0")])
    return tuple(out)


def elide_type_arguments(name: str) -> str:
    """`name` with the text inside each outermost pair of brackets as `...`."""
    out, depth = [], 0
    for c in name:
        if c == "[":
            if depth == 0:
                out.append("[...")
            depth += 1
        elif c == "]" and depth:
            depth -= 1
            if depth == 0:
                out.append("]")
        elif depth == 0:
            out.append(c)
    return "".join(out) if depth == 0 else name
