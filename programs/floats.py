"""Floating-point values in probe programs: `farg0`..`farg7`, `fretval`, `*(double *)p`,
`(float)farg0` and numbers written with a point (docs/programs.md, "Floating point").

A float or double travels as its IEEE 754 bits in a 64-bit word (a float's in the low
32, the rest 0). The probes never run a floating-point instruction: what a program does
with such a value is integer code, so no register, flag or status bit of the process's
floating-point state is touched: a comparison with a number and a conversion toward zero
are operations of lower.py's machine (fcompare, float_int) that each backend makes in a
few integer instructions, from what this module works out at compile time; a comparison
of two values is lowered here to the machine's integer operations.
The tracer turns the bits back into numbers when it prints them.
"""

from __future__ import annotations

import math
import struct
from typing import Callable, List

F32, F64 = "float", "double"  # the value types (checks.py's), as C names them
FLOATS = (F32, F64)

_FORMATS = {F32: ("<f", "<I"), F64: ("<d", "<Q")}
# exponent bits, mantissa bits, exponent bias
_LAYOUT = {F32: (8, 23, 127), F64: (11, 52, 1023)}
INT64_MAX = (1 << 63) - 1


class Single(float):
    """A float's value (a double that a float holds exactly), as the evaluator keeps it
    to tell it from a double's."""


def bits(value: float, kind: str) -> int:
    """The word that holds `value` (rounded to a float for F32)."""
    number, word = _FORMATS[kind]
    return struct.unpack(word, struct.pack(number, value))[0]


def from_bits(word: int, kind: str) -> float:
    """The exact value of a word's float (its low 32 bits) or double."""
    number, packed = _FORMATS[kind]
    mask = (1 << (32 if kind == F32 else 64)) - 1
    value = struct.unpack(number, struct.pack(packed, word & mask))[0]
    return Single(value) if kind == F32 else value


_NANS: dict = {}  # a NaN's bits -> one object for them (below)


def shown(value: float) -> float:
    """The number to print for a value: a float's shortest decimal that reads back as
    the same float (0.1, not 0.10000000149011612), a double as it is. A NaN is one
    object for its bits: a NaN is unequal to itself, and a map's key is its bits (the
    probes'), which a dictionary finds by identity first."""
    if math.isnan(value):
        word = struct.unpack("<Q", struct.pack("<d", value))[0]
        return _NANS.setdefault(word, float(value))
    if not isinstance(value, Single) or not math.isfinite(value):
        return float(value)
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.pack("<f", float(text)) == struct.pack("<f", value):
            return float(text)
    return float(value)


def truncated(value: float) -> int:
    """A value as an integer, as the probes convert it: toward zero, NaN 0, and
    beyond int64's range its nearest end (as arm64's fcvtzs)."""
    if math.isnan(value):
        return 0
    if value >= 2.0 ** 63:
        return INT64_MAX
    if value <= -2.0 ** 63:
        return -INT64_MAX - 1
    return int(value)


_FLOAT_MAX = struct.unpack("<f", struct.pack("<I", 0x7f7fffff))[0]


def _next_float(value: float, up: bool) -> float:
    """The float next to a float, above it or below."""
    if value == 0:
        return from_bits(1, F32) * (1 if up else -1)
    word = bits(value, F32)
    return from_bits(word + 1 if (value > 0) == up else word - 1, F32)


def compared(operator: str, left: float, right: float) -> bool:
    """`left OP right`, as C compares numbers (NaN unequal to everything)."""
    return {"==": left == right, "!=": left != right, "<": left < right, ">": left > right,
            "<=": left <= right, ">=": left >= right}[operator]


def _neighbours(value: float, kind: str):
    """The largest value of `kind` at or below `value` (not NaN), and the smallest at or
    above it."""
    if kind == F64 or math.isinf(value):
        return value, value
    if abs(value) > _FLOAT_MAX:
        return (_FLOAT_MAX, math.inf) if value > 0 else (-math.inf, -_FLOAT_MAX)
    nearest = float(from_bits(bits(value, F32), F32))
    if nearest == value:
        return value, value
    if nearest < value:
        return nearest, float(_next_float(nearest, True))
    return float(_next_float(nearest, False)), nearest


def ordered(value: float, kind: str) -> int:
    """A value's place in order as a signed integer (lower.py's order of words): the
    magnitude's bits, negated for a negative number (so -0 and 0 are one place)."""
    word = bits(value, kind)
    sign = 1 << (31 if kind == F32 else 63)
    magnitude = word & (sign - 1)
    return -magnitude if word & sign else magnitude


def constant_order(operator: str, constant: float, kind: str):
    """(operator, place) so that `x OP constant` is `ordered(x) OP place` for every x of
    `kind` that is not NaN (C compares a float with a double constant exactly: the
    constant is moved to the float next to it on the side that keeps the answer), or
    (None, answer) where the answer is the same for all of them."""
    if math.isnan(constant):
        return None, operator == "!="
    below, above = _neighbours(constant, kind)
    if operator in ("==", "!="):
        if below != constant:  # no value of this kind is equal to it
            return None, operator == "!="
        return operator, ordered(constant, kind)
    if operator in ("<", ">="):
        return operator, ordered(above, kind)
    return operator, ordered(below, kind)


# -- lowering: operations of lower.py's machine -----------------------------------------

Temp = Callable[[], int]  # a fresh local's index
Label = Callable[[], str]


def layout(kind: str):
    """(exponent bits, mantissa bits, exponent bias) of a float or a double."""
    return _LAYOUT[kind]


def _place(kind: str, word: int, magnitude: int, label: Label) -> List[tuple]:
    """Pushes ordered() of the value in local `word`, whose magnitude is in local
    `magnitude`."""
    positive, end = label(), label()
    sign = 1 << (31 if kind == F32 else 63)
    return [("local", word), ("const", sign), ("binary", "and", False),
            ("jump_zero", positive),
            ("local", magnitude), ("unary", "neg"), ("jump", end),
            ("label", positive), ("local", magnitude), ("label", end)]


def _magnitude(kind: str, word: int, magnitude: int) -> List[tuple]:
    sign = 1 << (31 if kind == F32 else 63)
    return [("local", word), ("const", sign - 1), ("binary", "and", False),
            ("set_local", magnitude)]


_NAN_ABOVE = {F32: 0x7f800000, F64: 0x7ff0000000000000}  # a magnitude above infinity's
_COMPARE = {"==": "eq", "!=": "ne", "<": "lt", ">": "gt", "<=": "le", ">=": "ge"}


def compare_constant(operator: str, constant: float, kind: str) -> List[tuple]:
    """Pops a value's word, pushes `value OP constant` as C says it (0 or 1; NaN is
    unequal to everything): one machine operation, `fcompare KIND OP PLACE` (push 1
    where the value is not NaN and ordered(value) OP PLACE, signed; else OP is ne),
    which each backend makes in a few integer instructions (its `float_test`), and a
    direct entry's leading predicate the same way."""
    operator, place = constant_order(operator, constant, kind)
    if operator is None:
        return [("drop",), ("const", int(place))]
    return [("fcompare", kind, _COMPARE[operator], place)]


def top_aligned(place: int, kind: str) -> int:
    """A place as the machines compare it, in a word whose top bit is the value's sign
    (a float's 32 bits shifted up by 32: the order is the same, the code one), as an
    unsigned 64-bit constant."""
    return (place << (32 if kind == F32 else 0)) & ((1 << 64) - 1)


def infinity_place(kind: str) -> int:
    """The top-aligned place of infinity: a magnitude above it is a NaN's."""
    return top_aligned(_NAN_ABOVE[kind], kind)


def compare_values(operator: str, kind: str, temp: Temp, label: Label) -> List[tuple]:
    """Pops two words of the same kind (the right one on top), pushes `left OP right`."""
    left, right, left_magnitude, right_magnitude = temp(), temp(), temp(), temp()
    number, end = label(), label()
    return [("set_local", right), ("set_local", left)] + \
        _magnitude(kind, left, left_magnitude) + _magnitude(kind, right, right_magnitude) + [
        ("local", left_magnitude), ("const", _NAN_ABOVE[kind]), ("compare", "gt", False),
        ("local", right_magnitude), ("const", _NAN_ABOVE[kind]), ("compare", "gt", False),
        ("binary", "or", False), ("jump_zero", number),
        ("const", int(operator == "!=")), ("jump", end),
        ("label", number)] + _place(kind, left, left_magnitude, label) + \
        _place(kind, right, right_magnitude, label) + [
        ("compare", _COMPARE[operator], True), ("label", end)]
