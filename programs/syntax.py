"""The nodes a probe program parses into: bpftrace's language, the part user-space
one-liners use (docs/programs.md lists it).

Every node keeps where it starts (`at`: line, column), so that a later check can
point at the text it refuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

Where = Tuple[int, int]  # line, column (1-based)


# -- probes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """One probe of a block's list, as written (`text`) and taken apart.

    kind: "uprobe", "uretprobe", "usdt", "BEGIN" or "END". path: the object as the
    program names it ("*" for any rewritten object). function: a name or glob
    (uprobe, uretprobe); offset: bytes past the function's start, or address: an
    absolute one (uprobe only). provider and name: a USDT probe's (provider "*" where
    the program leaves it out, as bpftrace allows)."""
    kind: str
    text: str
    at: Where
    path: Optional[str] = None
    function: Optional[str] = None
    offset: int = 0
    address: Optional[int] = None
    provider: Optional[str] = None
    name: Optional[str] = None


# -- expressions ------------------------------------------------------------------------

@dataclass(frozen=True)
class Integer:
    value: int
    at: Where


@dataclass(frozen=True)
class Real:
    """A number written with a point or an exponent (1.5, 2e-3): a double."""
    value: float
    at: Where


@dataclass(frozen=True)
class String:
    value: str
    at: Where


@dataclass(frozen=True)
class Builtin:
    """pid, tid, comm, nsecs, argN, retval, probe, func..."""
    name: str
    at: Where


@dataclass(frozen=True)
class Variable:
    """$name: a scalar of one hit (bpftrace's scratch variables)."""
    name: str
    at: Where


@dataclass(frozen=True)
class Map:
    """@name or @name[key, ...]: a map shared by every hit; "" is the unnamed @."""
    name: str
    keys: Tuple["Expression", ...]
    at: Where


@dataclass(frozen=True)
class Call:
    function: str
    arguments: Tuple["Expression", ...]
    at: Where


@dataclass(frozen=True)
class Unary:
    operator: str  # - ! ~
    operand: "Expression"
    at: Where


@dataclass(frozen=True)
class Binary:
    operator: str
    left: "Expression"
    right: "Expression"
    at: Where


@dataclass(frozen=True)
class Conditional:
    condition: "Expression"
    then: "Expression"
    otherwise: "Expression"
    at: Where


@dataclass(frozen=True)
class Cast:
    """(type) expr or (type *) expr: `pointer` is the number of stars."""
    type: str
    pointer: int
    operand: "Expression"
    at: Where


@dataclass(frozen=True)
class Dereference:
    """*expr: reads the memory a pointer expression points at."""
    operand: "Expression"
    at: Where


Expression = Union[Integer, Real, String, Builtin, Variable, Map, Call, Unary, Binary,
                   Conditional, Cast, Dereference]


# -- statements -------------------------------------------------------------------------

@dataclass(frozen=True)
class Assign:
    """target = value, or target OP= value (operator "+", "-", ...; "" for plain =)."""
    target: Union[Variable, Map]
    operator: str
    value: Expression
    at: Where


@dataclass(frozen=True)
class Evaluate:
    """An expression as a statement: a call such as printf(), delete(), exit()."""
    expression: Expression
    at: Where


@dataclass(frozen=True)
class If:
    condition: Expression
    then: Tuple["Statement", ...]
    otherwise: Tuple["Statement", ...]
    at: Where


Statement = Union[Assign, Evaluate, If]


# -- the program ------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    probes: Tuple[Probe, ...]
    predicate: Optional[Expression]
    body: Tuple[Statement, ...]
    at: Where


@dataclass(frozen=True)
class Program:
    blocks: Tuple[Block, ...]
    text: str = field(repr=False, default="")


def nodes(node):
    """Every node under `node` (a node, or a list or tuple of them), itself first."""
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from nodes(item)
    elif dataclasses.is_dataclass(node):
        yield node
        for f in dataclasses.fields(node):
            yield from nodes(getattr(node, f.name))
