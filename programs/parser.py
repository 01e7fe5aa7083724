"""Parses a probe program, bpftrace's syntax, into the nodes of syntax.py.

Hand-written rather than generated: bpftrace's language reads one way outside blocks
and another inside. A probe is a word up to the next space, comma or brace, whose path
may hold slashes; after the probes, a predicate is an expression between two slashes,
where a slash at the top level ends the predicate instead of dividing. A small
recursive-descent parser keeps those rules in one place and points each error at its
line and column.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from urewrite.errors import UrewriteError
from urewrite.programs.syntax import (Assign, Binary, Block, Builtin, Call, Cast,
                                      Conditional, Dereference, Evaluate, Expression, If,
                                      Integer, Map, Probe, Program, Real, Statement, String,
                                      Unary, Variable, Where)

# the probe kinds and bpftrace's short names for them
KINDS = {"uprobe": "uprobe", "u": "uprobe", "uretprobe": "uretprobe", "ur": "uretprobe",
         "usdt": "usdt", "U": "usdt", "BEGIN": "BEGIN", "END": "END"}

# types a cast or a pointer read may name: bytes, signed (float and double: checks.py's
# FLOATS, whose sign is in their bits)
TYPES = {"float": (4, False), "double": (8, False),
         "int8": (1, True), "int16": (2, True), "int32": (4, True), "int64": (8, True),
         "uint8": (1, False), "uint16": (2, False), "uint32": (4, False), "uint64": (8, False),
         "char": (1, True), "short": (2, True), "int": (4, True), "long": (8, True)}

# binary operators from the loosest to the tightest binding (C's order)
LEVELS = (("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="),
          ("<<", ">>"), ("+", "-"), ("*", "/", "%"))

_SYMBOLS = sorted(["<<=", ">>=", "==", "!=", "<=", ">=", "<<", ">>", "&&", "||", "++", "--",
                   "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "+", "-", "*", "/", "%",
                   "&", "|", "^", "!", "~", "<", ">", "=", "?", ":", "(", ")", "[", "]", "{",
                   "}", ",", ";"], key=len, reverse=True)
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")
_REAL = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "0": "\0", "'": "'"}


class ProgramError(UrewriteError):
    """A program the parser or a check refuses, with where it refuses it."""

    def __init__(self, message: str, at: Optional[Where] = None):
        self.at = at
        super().__init__(f"program:{at[0]}:{at[1]}: {message}" if at else f"program: {message}")


def parse(text: str) -> Program:
    """The program `text` as nodes; a ProgramError at the first thing it cannot read."""
    return _Parser(text).program()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.peeked: Optional[Tuple[str, str, int]] = None  # kind, text, start
        self.no_slash = False  # inside a predicate, at the top level: '/' ends it

    # -- where ----------------------------------------------------------------------------

    def where(self, pos: int) -> Where:
        line = self.text.count("\n", 0, pos) + 1
        return line, pos - (self.text.rfind("\n", 0, pos) + 1) + 1

    def fail(self, message: str, pos: Optional[int] = None):
        raise ProgramError(message, self.where(self.pos if pos is None else pos))

    # -- characters -----------------------------------------------------------------------

    def skip_space(self):
        text = self.text
        while self.pos < len(text):
            if text[self.pos].isspace():
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    self.fail("a comment that does not end")
                self.pos = end + 2
            else:
                return

    # -- tokens (inside blocks and predicates) ----------------------------------------------

    def peek(self) -> Tuple[str, str, int]:
        if self.peeked is None:
            self.peeked = self._token()
        return self.peeked

    def take(self) -> Tuple[str, str, int]:
        token = self.peek()
        self.peeked = None
        return token

    def accept(self, symbol: str) -> bool:
        kind, text, _ = self.peek()
        if kind == "symbol" and text == symbol:
            self.take()
            return True
        return False

    def expect(self, symbol: str):
        kind, text, start = self.peek()
        if not (kind == "symbol" and text == symbol):
            self.fail(f"expected '{symbol}', found {_shown(kind, text)}", start)
        self.take()

    def _token(self) -> Tuple[str, str, int]:
        self.skip_space()
        text, start = self.text, self.pos
        if start >= len(text):
            return "end", "", start
        char = text[start]
        if char == '"':
            return "string", self._string(), start
        real = _REAL.match(text, start)
        if real:
            self.pos = real.end()
            if self.pos < len(text) and (text[self.pos].isalnum() or text[self.pos] in "_."):
                self.fail(f"not a number: {text[start:self.pos + 1]}", start)
            return "real", real.group(), start
        number = _NUMBER.match(text, start)
        if number:
            self.pos = number.end()
            if self.pos < len(text) and (text[self.pos].isalnum() or text[self.pos] == "_"):
                self.fail(f"not a number: {text[start:self.pos + 1]}", start)
            return "number", number.group(), start
        if char in "$@":
            name = _NAME.match(text, start + 1)
            self.pos = name.end() if name else start + 1
            if char == "$" and not name:
                self.fail("a variable needs a name after '$'", start)
            return ("variable" if char == "$" else "map"), text[start + 1:self.pos], start
        name = _NAME.match(text, start)
        if name:
            self.pos = name.end()
            return "name", name.group(), start
        for symbol in _SYMBOLS:
            if text.startswith(symbol, start):
                self.pos = start + len(symbol)
                return "symbol", symbol, start
        self.fail(f"unexpected character {char!r}", start)

    def _string(self) -> str:
        text, pos, out = self.text, self.pos + 1, []
        while pos < len(text) and text[pos] != '"':
            if text[pos] == "\\" and pos + 1 < len(text):
                escape = text[pos + 1]
                if escape not in _ESCAPES:
                    self.fail(f"unknown escape \\{escape} in a string", pos)
                out.append(_ESCAPES[escape])
                pos += 2
            elif text[pos] == "\n":
                break
            else:
                out.append(text[pos])
                pos += 1
        if pos >= len(text) or text[pos] != '"':
            self.fail("a string that does not end on its line")
        self.pos = pos + 1
        return "".join(out)

    # -- the program --------------------------------------------------------------------------

    def program(self) -> Program:
        blocks = []
        self.skip_space()
        while self.pos < len(self.text):
            blocks.append(self.block())
            self.skip_space()
        if not blocks:
            self.fail("no probe: a program is one or more 'PROBE[, PROBE...] [/FILTER/] { ... }'")
        return Program(tuple(blocks), self.text)

    def block(self) -> Block:
        start = self.pos
        probes = [self.probe()]
        while True:
            self.skip_space()
            if not self.text.startswith(",", self.pos):
                break
            self.pos += 1
            self.skip_space()
            probes.append(self.probe())
        predicate = None
        if self.text.startswith("/", self.pos):
            self.pos += 1
            self.no_slash = True
            predicate = self.expression()
            self.no_slash = False
            kind, text, at = self.take()
            if (kind, text) != ("symbol", "/"):
                self.fail(f"expected '/' to end the filter, found {_shown(kind, text)}", at)
        self.expect("{")
        body = self.statements("}")
        return Block(tuple(probes), predicate, tuple(body), self.where(start))

    def probe(self) -> Probe:
        start = self.pos
        fields, text = self._probe_fields()
        at = self.where(start)
        if not fields or not fields[0]:
            self.fail("expected a probe (uprobe:PATH:FUNCTION, uretprobe:..., usdt:PATH:PROVIDER:NAME, "
                      "BEGIN or END)", start)
        kind = KINDS.get(fields[0])
        if kind is None:
            self.fail(f"unknown probe type '{fields[0]}' in {text} (urewrite runs uprobe, uretprobe, "
                      f"usdt, BEGIN and END)", start)
        if kind in ("BEGIN", "END"):
            if len(fields) != 1:
                self.fail(f"{kind} takes no path or name: {text}", start)
            return Probe(kind, text, at)
        if len(fields) < 3 or not fields[1] or not all(fields[2:]) and kind == "usdt":
            form = "usdt:PATH:[PROVIDER:]NAME" if kind == "usdt" else f"{kind}:PATH:FUNCTION"
            self.fail(f"{text}: a {kind} probe is {form}", start)
        path = fields[1]
        if kind == "usdt":
            if len(fields) > 4:
                self.fail(f"{text}: a usdt probe is usdt:PATH:[PROVIDER:]NAME", start)
            provider, name = (fields[2], fields[3]) if len(fields) == 4 else ("*", fields[2])
            return Probe(kind, text, at, path=path, provider=provider, name=name)
        rest = fields[2:]
        if len(rest) > 1 and rest[0] in ("cpp", "c"):  # bpftrace's language prefix
            rest = rest[1:]
        function = ":".join(rest)  # an unquoted C++ name's '::' split it
        if not function:
            self.fail(f"{text}: a {kind} probe is {kind}:PATH:FUNCTION", start)
        if _NUMBER.fullmatch(function):
            if kind != "uprobe":
                self.fail(f"{text}: an address takes an entry probe (uprobe), not {kind}", start)
            return Probe(kind, text, at, path=path, address=int(function, 0))
        offset = 0
        plus = re.fullmatch(r"(.+)\+(0[xX][0-9a-fA-F]+|[0-9]+)", function)
        if plus:
            if kind != "uprobe":
                self.fail(f"{text}: an offset takes an entry probe (uprobe), not {kind}", start)
            function, offset = plus.group(1), int(plus.group(2), 0)
        return Probe(kind, text, at, path=path, function=function, offset=offset)

    def _probe_fields(self) -> Tuple[List[str], str]:
        """A probe word split at its colons (those outside quotes), and its text."""
        text, pos, start = self.text, self.pos, self.pos
        fields, current, quoted = [], [], False
        while pos < len(text):
            char = text[pos]
            if char == '"':
                quoted = not quoted
            elif quoted:
                current.append(char)
            elif char.isspace() or char in ",{":
                break
            elif char == ":":
                fields.append("".join(current))
                current = []
            else:
                current.append(char)
            pos += 1
        if quoted:
            self.fail("a quoted part of a probe that does not end", start)
        fields.append("".join(current))
        self.pos = pos
        return (fields if pos > start else []), text[start:pos]

    # -- statements -------------------------------------------------------------------------

    def statements(self, closing: str) -> List[Statement]:
        body = []
        while not self.accept(closing):
            kind, text, start = self.peek()
            if kind == "end":
                self.fail(f"expected '{closing}' before the end of the program", start)
            if self.accept(";"):
                continue
            statement = self.statement()
            body.append(statement)
            if isinstance(statement, If):
                continue
            kind, text, start = self.peek()
            if not (kind == "symbol" and text in (";", closing)):
                self.fail(f"expected ';' or '{closing}' after a statement, found "
                          f"{_shown(kind, text)}", start)
        return body

    def statement(self) -> Statement:
        kind, text, start = self.peek()
        at = self.where(start)
        if kind == "name" and text == "if":
            self.take()
            self.expect("(")
            condition = self.expression()
            self.expect(")")
            self.expect("{")
            then = self.statements("}")
            otherwise: List[Statement] = []
            if self.peek()[:2] == ("name", "else"):
                self.take()
                if self.peek()[:2] == ("name", "if"):
                    otherwise = [self.statement()]
                else:
                    self.expect("{")
                    otherwise = self.statements("}")
            return If(condition, tuple(then), tuple(otherwise), at)
        expression = self.expression()
        kind, text, op_start = self.peek()
        if kind == "symbol" and text in ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
                                         "<<=", ">>=", "++", "--"):
            if not isinstance(expression, (Variable, Map)):
                self.fail("only a $variable or an @map can be assigned to", op_start)
            self.take()
            if text in ("++", "--"):
                return Assign(expression, text[0], Integer(1, at), at)
            return Assign(expression, text[:-1], self.expression(), at)
        return Evaluate(expression, at)

    # -- expressions ------------------------------------------------------------------------

    def expression(self) -> Expression:
        condition = self.binary(0)
        kind, text, start = self.peek()
        if kind == "symbol" and text == "?":
            self.take()
            then = self.expression()
            self.expect(":")
            otherwise = self.expression()
            return Conditional(condition, then, otherwise, self.where(start))
        return condition

    def binary(self, level: int) -> Expression:
        if level == len(LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while True:
            kind, text, start = self.peek()
            if kind != "symbol" or text not in LEVELS[level] or (text == "/" and self.no_slash):
                return left
            self.take()
            left = Binary(text, left, self.binary(level + 1), self.where(start))

    def unary(self) -> Expression:
        kind, text, start = self.peek()
        at = self.where(start)
        if kind == "symbol" and text in ("-", "!", "~"):
            self.take()
            operand = self.unary()
            if text == "-" and isinstance(operand, Integer):
                return Integer(-operand.value, at)
            if text == "-" and isinstance(operand, Real):
                return Real(-operand.value, at)
            return Unary(text, operand, at)
        if kind == "symbol" and text == "*":
            self.take()
            return Dereference(self.unary(), at)
        if kind == "symbol" and text == "(" and self._cast_ahead():
            self.take()
            type_name = self.take()[1]
            stars = 0
            while self.accept("*"):
                stars += 1
            self.expect(")")
            return Cast(type_name, stars, self.unary(), at)
        return self.primary()

    def _cast_ahead(self) -> bool:
        """Whether the '(' just peeked opens a cast: '(' TYPE '*'* ')'."""
        match = re.compile(r"\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\*\s*)*\)").match(
            self.text, self.peeked[2])
        return bool(match) and match.group(1) in TYPES

    def primary(self) -> Expression:
        kind, text, start = self.take()
        at = self.where(start)
        if kind == "number":
            return Integer(int(text, 0) if not re.fullmatch(r"0[0-7]+", text) else int(text, 8), at)
        if kind == "real":
            return Real(float(text), at)
        if kind == "string":
            return String(text, at)
        if kind == "variable":
            return Variable(text, at)
        if kind == "map":
            keys: Tuple[Expression, ...] = ()
            if self.accept("["):
                keys = tuple(self.arguments("]"))
                if not keys:
                    self.fail(f"@{text}[] needs a key", start)
            return Map(text, keys, at)
        if kind == "name":
            if self.accept("("):
                return Call(text, tuple(self.arguments(")")), at)
            return Builtin(text, at)
        if kind == "symbol" and text == "(":
            outer, self.no_slash = self.no_slash, False
            inner = self.expression()
            self.no_slash = outer
            self.expect(")")
            return inner
        self.fail(f"expected an expression, found {_shown(kind, text)}", start)

    def arguments(self, closing: str) -> List[Expression]:
        outer, self.no_slash = self.no_slash, False
        values: List[Expression] = []
        if not self.accept(closing):
            values.append(self.expression())
            while not self.accept(closing):
                self.expect(",")
                values.append(self.expression())
        self.no_slash = outer
        return values


def _shown(kind: str, text: str) -> str:
    if kind == "end":
        return "the end of the program"
    if kind == "string":
        return f'"{text}"'
    if kind == "variable":
        return f"${text}"
    if kind == "map":
        return f"@{text}"
    return f"'{text}'"
