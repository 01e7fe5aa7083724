"""Runs a checked program's blocks in Python, one hit at a time: the reference for
what a program means, and what runs its BEGIN and END blocks in the tracer.

Values follow bpftrace's: 64-bit integers, `argN`, `retval`, `pid`, `tid` and `nsecs`
unsigned, literals signed; an operation with an unsigned operand is unsigned (C's
rule; checks.py's signed() has where bpftrace 0.17's types are not C's), and
aggregations read their value as signed. Division by zero gives 0 and the
remainder by zero the dividend, as eBPF's instructions do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from urewrite.programs import floats, output
from urewrite.programs.checks import (CONVERSION, STR, BlockChecker, Checked, cast_size,
                                      print_limits)
from urewrite.programs.output import (HIST_BUCKETS, MapData, average, hist_bucket,
                                      lhist_bucket)
from urewrite.programs.parser import ProgramError
from urewrite.programs.syntax import (Assign, Binary, Block, Builtin, Call, Cast,
                                      Conditional, Dereference, Evaluate, If, Integer, Map,
                                      Probe, Real, String, Unary, Variable)

MASK = (1 << 64) - 1


def _wrap(value: int, signed: bool) -> int:
    value &= MASK
    return value - (1 << 64) if signed and value >> 63 else value


def _signed(value: int) -> int:
    return _wrap(value, True)


@dataclass
class Hit:
    """What a probe knows when it fires."""
    probe: Probe
    function: str = ""
    args: Tuple[int, ...] = ()
    retval: int = 0
    fargs: Tuple[int, ...] = ()  # the floating-point argument registers' low 64 bits
    fretval: int = 0  # (the first of them at a return)
    pid: int = 0
    tid: int = 0
    nsecs: int = 0
    comm: str = ""
    read: Optional[Callable[[int, int], Optional[bytes]]] = None  # address, size


@dataclass
class State:
    """A program's maps and what it printed."""
    checked: Checked
    maps: Dict[str, MapData] = field(default_factory=dict)
    printed: List[str] = field(default_factory=list)
    exited: bool = False

    def __post_init__(self):
        for name, info in self.checked.maps.items():
            self.maps[name] = MapData(name, info.kind, lhist=info.lhist, keyed=bool(info.keys))


class _Exit(Exception):
    pass


def run_block(state: State, block: Block, hit: Hit) -> None:
    """One hit of `block`'s probes: its filter, then its statements."""
    frame = _Frame(state, hit)
    if block.predicate is not None and not frame.value(block.predicate)[0]:
        return
    try:
        frame.statements(block.body)
    except _Exit:
        state.exited = True


class _Frame:
    def __init__(self, state: State, hit: Hit):
        self.state = state
        self.hit = hit
        self.variables: Dict[str, Tuple[object, bool]] = {}

    # -- statements ---------------------------------------------------------------------

    def statements(self, body):
        for statement in body:
            if isinstance(statement, If):
                branch = statement.then if self.value(statement.condition)[0] else statement.otherwise
                self.statements(branch)
            elif isinstance(statement, Assign):
                self.assign(statement)
            elif isinstance(statement, Evaluate):
                self.call(statement.expression)

    def assign(self, statement: Assign):
        target, value = statement.target, statement.value
        if isinstance(target, Variable):
            new = self.value(value)
            if statement.operator:
                new = _arithmetic(statement.operator, self.variables[target.name], new)
            self.variables[target.name] = new
            return
        data = self.state.maps[target.name]
        key = tuple(self.key(k) for k in target.keys)
        if isinstance(value, Call) and value.function in _AGGREGATE:
            _AGGREGATE[value.function](self, data, key, value)
            return
        new = self.value(value)
        if statement.operator:
            new = _arithmetic(statement.operator, (data.entries.get(key, 0), True), new)
        signed = self.state.checked.maps[target.name].signed
        data.entries[key] = new[0] if isinstance(new[0], str) else \
            floats.shown(new[0]) if isinstance(new[0], float) else _wrap(new[0], signed)

    def key(self, expression):
        """A key's value: integers as signed, as bpftrace prints them."""
        value, _ = self.value(expression)
        return value if isinstance(value, str) else \
            floats.shown(value) if isinstance(value, float) else _signed(value)

    # -- aggregations -------------------------------------------------------------------

    def _count(self, data, key, call):
        data.entries[key] = data.entries.get(key, 0) + 1

    def _sum(self, data, key, call):
        signed = self.state.checked.maps[data.name].signed
        data.entries[key] = _wrap(data.entries.get(key, 0) + self.number(call.arguments[0]),
                                  signed)

    def _min(self, data, key, call):
        v = self.number(call.arguments[0])
        data.entries[key] = min(data.entries.get(key, v), v)

    def _max(self, data, key, call):
        v = self.number(call.arguments[0])
        data.entries[key] = max(data.entries.get(key, v), v)

    def _average(self, data, key, call):
        count, total = data.entries.get(key, (0, 0))
        data.entries[key] = (count + 1, _signed(total + self.number(call.arguments[0])))

    def _hist(self, data, key, call):
        buckets = data.entries.setdefault(key, [0] * HIST_BUCKETS)
        buckets[hist_bucket(self.number(call.arguments[0]))] += 1

    def _lhist(self, data, key, call):
        low, high, step = data.lhist
        buckets = data.entries.setdefault(key, [0] * ((high - low) // step + 2))
        buckets[lhist_bucket(self.number(call.arguments[0]), low, high, step)] += 1

    def number(self, expression) -> int:
        """An aggregation's value: its 64 bits as a signed number (a float's toward zero)."""
        value = self.value(expression)[0]
        return floats.truncated(value) if isinstance(value, float) else _signed(value)

    # -- calls as statements ------------------------------------------------------------

    def call(self, call: Call):
        name = call.function
        if name == "printf":
            values = [self.value(a)[0] for a in call.arguments[1:]]
            values = [floats.shown(v) if isinstance(v, float) else v for v in values]
            self.state.printed.append(printf_text(call.arguments[0].value, values))
        elif name == "exit":
            raise _Exit()
        elif name == "delete":
            target = call.arguments[0]
            self.state.maps[target.name].entries.pop(tuple(self.key(k) for k in target.keys), None)
        elif name == "clear":
            self.state.maps[call.arguments[0].name].entries.clear()
        elif name == "zero":
            data = self.state.maps[call.arguments[0].name]
            for key, value in data.entries.items():
                data.entries[key] = (0, 0) if isinstance(value, tuple) else \
                    [0] * len(value) if isinstance(value, list) else 0
        elif name == "print":
            self.state.printed.append(output.text([self.state.maps[call.arguments[0].name]],
                                                  *print_limits(call)))
        else:
            self.value(call)

    # -- expressions: (value, signed) -------------------------------------------------------

    def value(self, expression) -> Tuple[object, bool]:
        if isinstance(expression, Integer):
            return _wrap(expression.value, True), True
        if isinstance(expression, Real):
            return expression.value, True
        if isinstance(expression, String):
            return expression.value, False
        if isinstance(expression, Builtin):
            return self.builtin(expression.name)
        if isinstance(expression, Variable):  # (0 where this hit has not assigned it)
            return self.variables.get(expression.name, (0, True))
        if isinstance(expression, Map):
            data = self.state.maps[expression.name]
            key = tuple(self.key(k) for k in expression.keys)
            # (a missing entry holds zeros: a map of strings' reads "", as bpftrace's)
            stored = data.entries.get(key, "" if self.state.checked.maps[expression.name].value
                                      == STR else 0)
            if isinstance(stored, str):
                return stored, False
            if isinstance(stored, float):
                return stored, True
            # (its sign is the map's, as checks.py's signed() says: @m = arg0 is unsigned)
            signed = self.state.checked.maps[expression.name].signed
            value = average(*stored) if isinstance(stored, tuple) else stored
            return _wrap(value, signed), signed
        if isinstance(expression, Unary):
            value, signed = self.value(expression.operand)
            if expression.operator == "!":  # (unsigned: bpftrace 0.17's, of anything)
                return int(value == 0), False
            return _wrap(-value if expression.operator == "-" else ~value, signed), signed
        if isinstance(expression, Binary):
            return self.binary(expression)
        if isinstance(expression, Conditional):
            taken = bool(self.value(expression.condition)[0])
            chosen, other = (expression.then, expression.otherwise) if taken else \
                (expression.otherwise, expression.then)
            value, signed = self.value(chosen)
            if isinstance(value, (str, float)):
                return value, signed
            # the `then` side's sign, as bpftrace 0.17's (the other side read for its
            # sign only: an expression changes nothing)
            signed = signed if taken else self.value(other)[1]
            return _wrap(value, signed), signed
        if isinstance(expression, Cast):
            size, signed = cast_size(expression.type)
            value, _ = self.value(expression.operand)
            if expression.pointer:
                return _wrap(value, False), False
            if expression.type == floats.F32 and not isinstance(value, floats.Single):
                # (float)farg0: the register's low half is the float
                return floats.from_bits(floats.bits(value, floats.F64), floats.F32), True
            if expression.type in floats.FLOATS:
                return value, True
            if isinstance(value, float):
                value = floats.truncated(value)
            # (a narrow cast's value widened by the new type's sign: bpftrace 0.17's)
            bits = 8 * min(size, BlockChecker.narrow(expression.operand))
            value &= (1 << bits) - 1
            if signed and value >> (bits - 1):
                value -= 1 << bits
            return _wrap(value, signed), signed
        if isinstance(expression, Dereference):
            return self.dereference(expression)
        if isinstance(expression, Call) and expression.function == "str":
            return self.string(expression)
        raise ProgramError(f"{type(expression).__name__} has no value", getattr(expression, "at", None))

    def builtin(self, name: str) -> Tuple[object, bool]:
        hit = self.hit
        if name.startswith("farg") or name == "fretval":
            index = int(name[4:]) if name != "fretval" else 0
            word = (hit.fargs[index] if index < len(hit.fargs) else 0) if name != "fretval" \
                else hit.fretval
            return floats.from_bits(word, floats.F64), True
        if name.startswith("arg"):
            index = int(name[3:])
            return (_wrap(hit.args[index], False) if index < len(hit.args) else 0), False
        if name == "retval":
            return _wrap(hit.retval, False), False
        if name in ("pid", "tid", "nsecs"):
            return _wrap(getattr(hit, name), False), False
        if name == "comm":
            return hit.comm, False
        if name == "func":
            return hit.function, False
        return hit.probe.text, False  # probe

    def binary(self, expression: Binary) -> Tuple[object, bool]:
        operator = expression.operator
        # (a comparison's and && and ||'s sign: both sides', as bpftrace 0.17 types them;
        # the right side of a short circuit read for its sign only: an expression changes
        # nothing)
        if operator in ("&&", "||"):
            left, right = self.value(expression.left), self.value(expression.right)
            both = bool(left[0]) and bool(right[0]) if operator == "&&" else \
                bool(left[0]) or bool(right[0])
            return int(both), _sign(left) and _sign(right)
        left, right = self.value(expression.left), self.value(expression.right)
        if isinstance(left[0], str):
            equal = left[0] == right[0]
            return int(equal if operator == "==" else not equal), True
        if operator in _COMPARE and (isinstance(left[0], float) or isinstance(right[0], float)):
            a, b = (float(v if isinstance(v, float) else _signed(v)) for v, _ in (left, right))
            return int(floats.compared(operator, a, b)), True
        if operator in _COMPARE:
            signed = left[1] and right[1]
            a, b = _wrap(left[0], signed), _wrap(right[0], signed)
            return int(_COMPARE[operator](a, b)), signed
        return _arithmetic(operator, left, right)

    def dereference(self, expression: Dereference) -> Tuple[int, bool]:
        cast = expression.operand
        size, signed = cast_size(cast.type)
        address, _ = self.value(cast.operand)
        data = self.hit.read(address, size) if self.hit.read else None
        if cast.type in floats.FLOATS:  # (an unreadable one reads as 0's bits: 0.0)
            word = int.from_bytes(data, "little") if data and len(data) == size else 0
            return floats.from_bits(word, cast.type), True
        if data is None or len(data) != size:
            return 0, signed
        return _wrap(int.from_bytes(data, "little", signed=signed), signed), signed

    def string(self, call: Call) -> Tuple[str, bool]:
        limit = call.arguments[1].value if len(call.arguments) > 1 else 64
        address, _ = self.value(call.arguments[0])
        data = self.hit.read(address, limit) if self.hit.read else None
        if not data:
            return "", False
        return data.split(b"\0", 1)[0][:limit - 1].decode("utf-8", "replace"), False


_AGGREGATE = {"count": _Frame._count, "sum": _Frame._sum, "min": _Frame._min,
              "max": _Frame._max, "avg": _Frame._average, "stats": _Frame._average,
              "hist": _Frame._hist, "lhist": _Frame._lhist}

_COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}


def _sign(value: Tuple[object, bool]) -> bool:
    """A value's sign, where a string's or a float's counts as signed."""
    return value[1] or isinstance(value[0], (str, float))


def _arithmetic(operator: str, left: Tuple[int, bool], right: Tuple[int, bool]) -> Tuple[int, bool]:
    signed = left[1] and right[1]
    a, b = _wrap(left[0], signed), _wrap(right[0], signed)
    if operator == "+":
        result = a + b
    elif operator == "-":
        result = a - b
    elif operator == "*":
        result = a * b
    elif operator == "/":
        result = 0 if b == 0 else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)
    elif operator == "%":
        result = a if b == 0 else a - b * ((abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1))
    elif operator == "&":
        result = a & b
    elif operator == "|":
        result = a | b
    elif operator == "^":
        result = a ^ b
    elif operator == "<<":
        result = a << (b & 63)
    elif operator == ">>":
        result = (a & MASK) >> (b & 63)  # (zeros shifted in: bpftrace 0.17's, signed too)
    else:
        raise ProgramError(f"unknown operator {operator}")
    return _wrap(result, signed), signed


def printf_text(text: str, values: List[object]) -> str:
    """C's printf for the conversions checks.py lets through. An integer conversion
    prints the width its length says, as C's (and bpftrace 0.17's) do: %d, %u, %x of
    the low 32 bits, %hd 16, %hhd 8, %ld, %lld, %zd, %jd, %td all 64."""
    values = list(values)

    def convert(match):
        if match.group() == "%%":
            return "%"
        spec, conversion = match.group(), match.group(1)
        value = values.pop(0)
        length = re.search(r"(hh|h|ll|l|L|z|j|t)?[a-zA-Z]$", spec).group(1) or ""
        plain = re.sub(r"(hh|h|ll|l|L|z|j|t)(?=[a-zA-Z]$)", "", spec)
        if conversion in "diuxXo":
            bits = {"hh": 8, "h": 16, "": 32}.get(length, 64)
            value &= (1 << bits) - 1
            if conversion in "di":
                return plain % (value - (1 << bits) if value >> (bits - 1) else value)
            return plain.replace("u", "d") % value
        if conversion == "c":
            return plain % chr(value & 0xff)
        if conversion == "p":
            return f"0x{_wrap(value, False):x}"
        return plain % value

    return CONVERSION.sub(convert, text)
