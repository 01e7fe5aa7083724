"""Checks a parsed program before anything runs it, and learns what its maps hold.

A program that passes is one the probes can run: every name is known, every call has
the arguments it takes, each map is used one way throughout (the same aggregation,
the same number of keys), and each value is used as what it is (a string is not
added to a number). Each refusal is one line that points at the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from urewrite.programs.floats import F32, F64, FLOATS
from urewrite.programs.parser import TYPES, ProgramError
from urewrite.programs.syntax import (Assign, Binary, Block, Builtin, Call, Cast,
                                      Conditional, Dereference, Evaluate, Expression, If,
                                      Integer, Map, Program, Real, String, Unary, Variable)

MAX_ARGS = 8  # arg0..arg7: the registers of the calling conventions urewrite reads

# value types (and floats.py's F32, F64: a float's or a double's bits)
INT, STR = "int", "string"

# builtins: the type each gives, and the probe kinds it means something in
BUILTINS = {"pid": INT, "tid": INT, "nsecs": INT, "comm": STR, "probe": STR, "func": STR,
            "retval": INT, **{f"arg{i}": INT for i in range(MAX_ARGS)},
            "fretval": F64, **{f"farg{i}": F64 for i in range(MAX_ARGS)}}

COMPARISONS = ("==", "!=", "<", ">", "<=", ">=")  # what floating-point values take

AGGREGATIONS = {"count": 0, "sum": 1, "min": 1, "max": 1, "avg": 1, "stats": 1, "hist": 1,
                "lhist": 4}

# printf's conversions (bpftrace takes C's, with these lengths)
CONVERSION = re.compile(r"%%|%[-+ 0#]*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?([diouxXcspfFeEgG])|%")
FLOAT_CONVERSIONS = "fFeEgG"

_NO_FLOAT_ARITHMETIC = ("floating-point values are compared (<, ==, ...) and printed, not "
                        "computed with: (int64)farg0 is the integer toward zero")


@dataclass
class MapInfo:
    kind: str  # count, sum, min, max, avg, stats, hist, lhist, value
    keys: Tuple[str, ...]  # the type of each key
    value: str = INT  # a plain value's type
    lhist: Optional[Tuple[int, int, int]] = None
    # whether a value prints as signed: bpftrace's sum() and plain values take their
    # expression's sign; count() is unsigned; min, max, avg, stats and histograms signed
    signed: bool = True


@dataclass
class Checked:
    program: Program
    maps: Dict[str, MapInfo] = field(default_factory=dict)


def check(program: Program) -> Checked:
    """The program's maps; a ProgramError at the first thing no probe could run."""
    checked = Checked(program)
    # maps are global: a block may read one that a later block assigns, so the first
    # pass learns every assignment and the second checks every use
    for strict in (False, True):
        for block in program.blocks:
            BlockChecker(checked, block, strict).run()
    return checked


class BlockChecker:
    def __init__(self, checked: Checked, block: Block, strict: bool):
        self.checked = checked
        self.strict = strict
        self.block = block
        self.kinds = {probe.kind for probe in block.probes}
        self.variables: Dict[str, str] = {}
        self.signs: Dict[str, bool] = {}  # each $variable's

    def run(self):
        if self.block.predicate is not None:
            self.integer(self.block.predicate, "a filter")
        self.statements(self.block.body)

    # -- statements -----------------------------------------------------------------------

    def statements(self, body):
        for statement in body:
            if isinstance(statement, If):
                self.integer(statement.condition, "an if's condition")
                self.statements(statement.then)
                self.statements(statement.otherwise)
            elif isinstance(statement, Assign):
                self.assign(statement)
            elif isinstance(statement, Evaluate):
                expression = statement.expression
                if isinstance(expression, Call) and expression.function in AGGREGATIONS:
                    raise ProgramError(f"{expression.function}() must be assigned to a map: "
                                       f"@name = {expression.function}(...)", expression.at)
                self.type_of(expression, statement=True)

    def assign(self, statement: Assign):
        target, value = statement.target, statement.value
        if isinstance(target, Variable):
            if isinstance(value, Call) and value.function in AGGREGATIONS:
                raise ProgramError(f"{value.function}() goes into a map, not ${target.name}",
                                   value.at)
            kind = self.type_of(value)
            if statement.operator and self.variables.get(target.name) in FLOATS:
                raise ProgramError(f"${target.name} {statement.operator}=: "
                                   f"{_NO_FLOAT_ARITHMETIC}", value.at)
            if statement.operator and kind != INT:
                raise ProgramError(f"${target.name} {statement.operator}= needs a number", value.at)
            self.signs[target.name] = self.signed(value) if not statement.operator else \
                self.signs.get(target.name, True) and self.signed(value)
            known = self.variables.setdefault(target.name, kind)
            if known != kind:
                raise ProgramError(f"${target.name} holds a {known}, not a {kind}", value.at)
            return
        keys = tuple(self.key_type(key) for key in target.keys)
        if isinstance(value, Call) and value.function in AGGREGATIONS:
            if statement.operator:
                raise ProgramError(f"@{target.name} {statement.operator}= {value.function}(): "
                                   f"an aggregation is assigned with '='", value.at)
            info = MapInfo(value.function, keys, lhist=self.aggregation(value),
                           signed=value.function != "count" and (
                               value.function != "sum" or self.signed(value.arguments[0])))
        else:
            kind = self.type_of(value)
            if statement.operator and kind != INT:
                raise ProgramError(f"@{target.name} {statement.operator}= needs a number", value.at)
            # @x++ and @x += N count and add as bpftrace's do: a sum the probes keep
            info = MapInfo("sum" if statement.operator == "+" else "value", keys, kind,
                           signed=self.signed(value))
        self.declare(target, info)

    def declare(self, target: Map, info: MapInfo):
        known = self.checked.maps.get(target.name)
        shown = f"@{target.name}"
        if known is None:
            self.checked.maps[target.name] = info
            return
        if len(known.keys) != len(info.keys):
            raise ProgramError(f"{shown} has {len(known.keys)} key(s) elsewhere, "
                               f"{len(info.keys)} here", target.at)
        for i, (was, now) in enumerate(zip(known.keys, info.keys)):
            if was != now:
                raise ProgramError(f"{shown}'s key {i + 1} is a {was} elsewhere, a {now} here",
                                   target.at)
        if known.kind == info.kind == "value" and known.value != info.value:
            # (a map of strings holds 64 bytes, copied from where its value points)
            raise ProgramError(f"{shown} holds a{'n' * (known.value == INT)} {known.value} "
                               f"elsewhere, a{'n' * (info.value == INT)} {info.value} here",
                               target.at)
        same = known.kind != info.kind and {known.kind, info.kind} <= {"value", "sum"} \
            and known.value == info.value == INT
        if known.kind != info.kind and not same:
            raise ProgramError(f"{shown} is a {_described(known)} elsewhere, "
                               f"a {_described(info)} here", target.at)
        if known.lhist != info.lhist:
            raise ProgramError(f"{shown} has lhist bounds {known.lhist} elsewhere, "
                               f"{info.lhist} here", target.at)
        if same:  # a value a probe assigns and another adds to: a plain value
            known.kind = "value"

    def aggregation(self, call: Call) -> Optional[Tuple[int, int, int]]:
        wanted = AGGREGATIONS[call.function]
        if len(call.arguments) != wanted:
            raise ProgramError(f"{call.function}() takes {wanted} argument(s), "
                               f"not {len(call.arguments)}", call.at)
        for argument in call.arguments:
            self.number(argument, f"{call.function}()'s argument")
        if call.function != "lhist":
            return None
        bounds = []
        for argument in call.arguments[1:]:
            if not isinstance(argument, Integer):
                raise ProgramError("lhist()'s min, max and step are numbers written in the "
                                   "program", argument.at)
            bounds.append(argument.value)
        low, high, step = bounds
        if low < 0:  # as bpftrace
            raise ProgramError(f"lhist()'s min must not be negative (it is {low})", call.at)
        if step <= 0 or high <= low or (high - low) // step > 1000:
            raise ProgramError(f"lhist(value, {low}, {high}, {step}): needs min < max, step > 0 "
                               f"and at most 1000 buckets", call.at)
        return low, high, step

    # -- expressions ----------------------------------------------------------------------

    def signed(self, expression: Expression) -> bool:
        """Whether an integer expression is signed, by bpftrace 0.17's rules (C's, but
        where noted): literals are, argN, retval, pid, tid and nsecs are not, arithmetic
        is unsigned when an operand is, and so are a comparison's and && and ||'s 0 or 1
        (C's are int), and ! is always, a cast has its type's sign, `c ? a : b` a's (C:
        the common type); >> shifts zeros in (lower.py)."""
        if isinstance(expression, Builtin):
            return expression.name not in BUILTINS or BUILTINS[expression.name] != INT
        if isinstance(expression, Variable):
            return self.signs.get(expression.name, True)
        if isinstance(expression, Map):
            known = self.checked.maps.get(expression.name)
            return known is None or known.signed
        if isinstance(expression, Unary):  # (! is unsigned in bpftrace 0.17)
            return expression.operator != "!" and self.signed(expression.operand)
        if isinstance(expression, Binary):
            return self.signed(expression.left) and self.signed(expression.right)
        if isinstance(expression, Conditional):  # its `then` side's, as bpftrace 0.17's
            return self.signed(expression.then)
        if isinstance(expression, Cast):  # (a float's value as an integer is signed)
            return expression.pointer == 0 and (expression.type in FLOATS or
                                                cast_size(expression.type)[1])
        if isinstance(expression, Dereference):
            return expression.operand.type in FLOATS or cast_size(expression.operand.type)[1]
        return True  # literals

    @staticmethod
    def narrow(expression: Expression) -> int:
        """The bytes of an integer cast's value (a cast to int8..int32, uint8..uint32), else
        8: bpftrace 0.17 widens such a value by its new type's sign, not its own
        ((uint64)(int16)x is x's low 16 bits; (int32)(uint8)x sign-extends them)."""
        if isinstance(expression, Cast) and not expression.pointer and \
                expression.type not in FLOATS:
            return cast_size(expression.type)[0]
        return 8

    def integer(self, expression: Expression, what: str):
        kind = self.type_of(expression)
        if kind in FLOATS:
            raise ProgramError(f"{what} must be an integer, not a {kind}: compare it "
                               f"(farg0 != 0) or convert it ((int64)farg0)", expression.at)
        if kind != INT:
            raise ProgramError(f"{what} must be a number, not a string", expression.at)

    def number(self, expression: Expression, what: str):
        """An integer, or a float or double that becomes one (toward zero)."""
        if self.type_of(expression) == STR:
            raise ProgramError(f"{what} must be a number, not a string", expression.at)

    def key_type(self, expression: Expression) -> str:
        if isinstance(expression, Call) and expression.function in AGGREGATIONS:
            raise ProgramError(f"{expression.function}() cannot be a key", expression.at)
        return self.type_of(expression)

    def type_of(self, expression: Expression, statement: bool = False) -> str:
        if isinstance(expression, Integer):
            return INT
        if isinstance(expression, Real):
            return F64
        if isinstance(expression, String):
            return STR
        if isinstance(expression, Builtin):
            return self.builtin(expression)
        if isinstance(expression, Variable):
            if expression.name not in self.variables:
                raise ProgramError(f"${expression.name} is used before it is assigned",
                                   expression.at)
            return self.variables[expression.name]
        if isinstance(expression, Map):
            known = self.checked.maps.get(expression.name)
            if known is None:
                if not self.strict:
                    return INT
                raise ProgramError(f"@{expression.name} is read, and no probe assigns it",
                                   expression.at)
            if len(expression.keys) != len(known.keys):
                raise ProgramError(f"@{expression.name} has {len(known.keys)} key(s), "
                                   f"not {len(expression.keys)}", expression.at)
            for key in expression.keys:
                self.key_type(key)
            if known.kind in ("hist", "lhist", "stats"):
                raise ProgramError(f"@{expression.name} is a {known.kind}(), which is printed, "
                                   f"not read", expression.at)
            return known.value if known.kind == "value" else INT
        if isinstance(expression, Unary):
            self.integer(expression.operand, f"'{expression.operator}'s operand")
            return INT
        if isinstance(expression, Binary):
            left, right = self.type_of(expression.left), self.type_of(expression.right)
            if left == right == STR and expression.operator in ("==", "!="):
                return INT
            if expression.operator in COMPARISONS and (left in FLOATS or right in FLOATS):
                return self.float_comparison(expression, left, right)
            if left in FLOATS or right in FLOATS or isinstance(expression.left, Real) or \
                    isinstance(expression.right, Real):
                raise ProgramError(f"'{expression.operator}': {_NO_FLOAT_ARITHMETIC}",
                                   expression.at)
            if INT != left or INT != right:
                raise ProgramError(f"'{expression.operator}' takes numbers (strings compare "
                                   f"only with == and !=)", expression.at)
            return INT
        if isinstance(expression, Conditional):
            self.integer(expression.condition, "a condition")
            then, otherwise = self.type_of(expression.then), self.type_of(expression.otherwise)
            if then != otherwise:
                raise ProgramError("both sides of '?:' must be numbers, or both strings",
                                   expression.at)
            return then
        if isinstance(expression, Cast):
            return self.cast(expression)
        if isinstance(expression, Dereference):
            operand = expression.operand
            if not (isinstance(operand, Cast) and operand.pointer):
                raise ProgramError("a pointer read names its type: *(uint32 *)(arg0 + 8)",
                                   expression.at)
            if operand.pointer > 1:
                raise ProgramError("one level of pointer at a time: *(uint64 *)", expression.at)
            return operand.type if operand.type in FLOATS else INT
        if isinstance(expression, Call):
            return self.call(expression, statement)
        raise ProgramError("not an expression", getattr(expression, "at", None))

    def cast(self, expression: Cast) -> str:
        operand = self.type_of(expression.operand)
        if expression.pointer or expression.type not in FLOATS:
            if expression.pointer or operand not in FLOATS:
                self.integer(expression.operand, "a cast's operand")
            return INT  # (a float's or a double's value toward zero, as C's)
        if expression.type == F32 and not (isinstance(expression.operand, Builtin) and
                                          BUILTINS.get(expression.operand.name) == F64):
            raise ProgramError("(float) says that a register holds a float: (float)farg0, "
                               "(float)fretval; *(float *)p reads one", expression.at)
        if expression.type == F64 and operand != F64:
            raise ProgramError(f"(double) takes a double, not a{'n' * (operand == INT)} "
                               f"{operand}", expression.at)
        return expression.type

    def float_comparison(self, expression: Binary, left: str, right: str) -> str:
        """A comparison where a side is a float or a double: with one of the same type,
        or with a number written in the program."""
        literal = (Integer, Real)
        if left in FLOATS and right in FLOATS and left != right and not (
                isinstance(expression.left, literal) or isinstance(expression.right, literal)):
            raise ProgramError(f"'{expression.operator}' compares a {left} with a {right}: "
                               f"compare floats with floats, doubles with doubles",
                               expression.at)
        for side, kind in ((expression.left, left), (expression.right, right)):
            if kind == INT and not isinstance(side, Integer):
                raise ProgramError(f"'{expression.operator}' compares a floating-point value "
                                   f"with an integer: convert one ((int64)farg0) or write a "
                                   f"number", side.at)
            if kind == STR:
                raise ProgramError(f"'{expression.operator}' takes numbers", side.at)
        return INT

    def builtin(self, expression: Builtin) -> str:
        name = expression.name
        if name not in BUILTINS:
            hint = " (urewrite reads arg0 to arg7, farg0 to farg7)" \
                if re.fullmatch(r"f?arg\d+", name) else ""
            raise ProgramError(f"unknown builtin '{name}'{hint}", expression.at)
        if name in ("retval", "fretval") and self.kinds - {"uretprobe"}:
            raise ProgramError(f"{name} exists in uretprobe blocks only", expression.at)
        if name.startswith("farg") and self.kinds - {"uprobe"}:
            raise ProgramError(f"{name} exists in uprobe blocks only (a function's "
                               f"floating-point registers; a USDT note names its own "
                               f"arguments)", expression.at)
        if name.startswith("arg") and self.kinds & {"uretprobe", "BEGIN", "END"}:
            raise ProgramError(f"{name} exists in uprobe and usdt blocks only", expression.at)
        if self.kinds & {"BEGIN", "END"} and name in ("tid", "probe", "func", "retval"):
            raise ProgramError(f"{name} means nothing in BEGIN or END", expression.at)
        return BUILTINS[name]

    def call(self, call: Call, statement: bool) -> str:
        name, arguments = call.function, call.arguments
        if name in AGGREGATIONS:
            raise ProgramError(f"{name}() must be assigned to a map: @name = {name}(...)", call.at)
        if name == "str":
            if not 1 <= len(arguments) <= 2:
                raise ProgramError("str(pointer[, length]) takes 1 or 2 arguments", call.at)
            for argument in arguments:
                self.integer(argument, "str()'s argument")
            if len(arguments) == 2 and not isinstance(arguments[1], Integer):
                raise ProgramError("str()'s length is a number written in the program",
                                   arguments[1].at)
            return STR
        if name not in ("printf", "delete", "clear", "print", "zero", "exit"):
            raise ProgramError(f"unknown function {name}()", call.at)
        if not statement:
            raise ProgramError(f"{name}() gives no value", call.at)
        if name == "printf":
            return self.printf(call)
        if name == "print" and 1 < len(arguments) <= 3 and isinstance(arguments[0], Map):
            for limit in arguments[1:]:  # (as bpftrace: numbers written out)
                if not isinstance(limit, Integer):
                    raise ProgramError("print(@name, top, div): top and div are integers "
                                       "written as numbers", limit.at)
            arguments = arguments[:1]
        if name in ("delete", "clear", "print", "zero"):
            if len(arguments) != 1 or not isinstance(arguments[0], Map):
                raise ProgramError(f"{name}() takes one map: {name}(@name"
                                   f"{'[key]' if name == 'delete' else ''}"
                                   f"{'[, top[, div]]' if name == 'print' else ''})", call.at)
            target = arguments[0]
            known = self.checked.maps.get(target.name)
            if known is None:
                if not self.strict:
                    return INT
                raise ProgramError(f"{name}(@{target.name}): no probe assigns @{target.name}",
                                   target.at)
            if name == "delete" and len(target.keys) != len(known.keys):
                raise ProgramError(f"delete(@{target.name}...) names {len(target.keys)} key(s); "
                                   f"the map has {len(known.keys)}", target.at)
            if name != "delete" and target.keys:
                raise ProgramError(f"{name}() takes the whole map: {name}(@{target.name})", target.at)
            for key in target.keys:
                self.key_type(key)
            return INT
        if name == "exit":
            if arguments:
                raise ProgramError("exit() takes no argument", call.at)
        return INT

    def printf(self, call: Call) -> str:
        arguments = call.arguments
        if not arguments or not isinstance(arguments[0], String):
            raise ProgramError('printf() starts with its format, a string: printf("%d\\n", pid)',
                               call.at)
        conversions = [m.group(1) for m in CONVERSION.finditer(arguments[0].value)
                       if m.group() != "%%"]
        if None in conversions:
            raise ProgramError(f"printf(): a '%' that starts no conversion in "
                               f"{arguments[0].value!r}", arguments[0].at)
        if len(conversions) != len(arguments) - 1:
            raise ProgramError(f"printf(): the format has {len(conversions)} conversion(s) for "
                               f"{len(arguments) - 1} value(s)", call.at)
        for conversion, argument in zip(conversions, arguments[1:]):
            kind = self.type_of(argument)
            if (conversion == "s") != (kind == STR) or \
                    (conversion in FLOAT_CONVERSIONS) != (kind in FLOATS):
                hint = " (convert it: (int64)farg0)" if kind in FLOATS else ""
                raise ProgramError(f"printf(): %{conversion} is given a{'n' * (kind == INT)} "
                                   f"{kind}{hint}", argument.at)
        if len(arguments) > 8:
            raise ProgramError("printf() takes at most 7 values", call.at)
        return INT


def _described(info: MapInfo) -> str:
    return "plain value" if info.kind == "value" else f"{info.kind}() map"


def cast_size(type_name: str) -> Tuple[int, bool]:
    """A cast's or a pointer read's size in bytes, and whether it is signed."""
    return TYPES[type_name]


def print_limits(call: Call) -> Tuple[int, int]:
    """print(@m, top, div)'s top and div (0 and 1 when not given)."""
    given = [a.value for a in call.arguments[1:]]
    return tuple((given + [0, 1][len(given):])[:2])
