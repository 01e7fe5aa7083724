"""Lowers a checked program's blocks to the operations of a small stack machine, which
each architecture's backend turns into machine code (arch/*/program_code.py).

The context is trampolines/program_file.py's. The machine works on 64-bit words. A string is a word too: the address of a 64-byte
buffer (the context's comm, a constant in the code, or a scratch buffer str() reads
into). The code of a probe runs every block that names the probe, in program order,
with one argument: the address of its context (CONTEXT below), which the caller fills.

Operations (each a tuple, its name first):
    const V          push V                         ctx OFFSET    push the context's word
    arg N            push argument N (0 past the probe's arguments)
    farg N           push floating-point argument register N's low 64 bits, as the
                     probe found it (fretval: register 0); nothing else runs a
                     floating-point instruction (floats.py lowers what is done with them)
    fcompare K OP P  pop a float's (K "float") or double's (K "double") word, push 1 if
                     it is not NaN and floats.ordered() of it OP P (signed), else OP == ne
    float_int K      pop a float's or double's word, push its value toward zero as an
                     integer (NaN 0; past int64's range, its nearest end: floats.truncated)
    local N          push local N                   set_local N   pop into local N
    unary OP         neg, not (bitwise), lnot (0 or 1)
    binary OP S      add sub mul div mod and or xor shl shr; S: signed (div, mod; the
                     lowering never asks for a signed shr: bpftrace's >> shifts zeros in)
    compare OP S     eq ne lt gt le ge -> 0 or 1; S: signed
    cast SIZE S      keep SIZE bytes, then sign- (S) or zero-extend
    read SIZE S      pop an address, push what it holds (a checked read: 0 if unreadable)
    string_at N      push the address of constant string N (64 bytes, NUL-padded)
    read_string N K  pop an address, read a string of at most N bytes into scratch K
    string_eq        pop two strings, push 1 if equal
    jump L | jump_zero L (pops) | label L
    drop
    key_word I       pop a word into the key buffer's word I
    key_string I     pop a string, copy its 64 bytes into the key buffer from word I
    entry M          push the entry of map M for the key buffer, made if missing (0: full)
    find M           push the entry of map M for the key buffer, 0 if missing
    update M KIND    pop the value (none for count) and the entry; aggregate into it
                     (count sum min max avg hist lhist, or value: a plain assignment)
    load M           pop an entry (0 allowed), push its value word (0 if missing)
    load_string M K  pop an entry (0 allowed) of a map of strings, copy its string into
                     scratch K ("" if missing), push scratch K's address
    delete M         pop an entry (0 allowed): it holds nothing from now on
    printf N KINDS   pop the values (KINDS: "i" a word, "s" a string) into an event of
                     printf N, in the process's ring (exit(): a printf of no value whose
                     format is EXIT, then a jump to the block's end)
    return
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Set, Tuple

from urewrite.programs import floats
from urewrite.programs import maps as map_layout
from urewrite.programs.checks import (BUILTINS, STR, BlockChecker, Checked, cast_size,
                                      print_limits)
from urewrite.programs.parser import ProgramError
from urewrite.programs.reuse import reuse_lookups
from urewrite.programs.syntax import (Assign, Binary, Block, Builtin, Call, Cast,
                                      Conditional, Dereference, If, Integer, Map, Real,
                                      String, Unary, Variable, nodes)
from urewrite.trampolines.program_file import (ARGUMENTS, CTX_COMM, CTX_NSECS, CTX_PID,
                                               CTX_TID, USES_EVENT, USES_MAPS, USES_PID,
                                               context_uses)

STRING = 64             # the bytes of a string value (bpftrace's default strlen)

_BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "&": "and", "|": "or",
           "^": "xor", "<<": "shl", ">>": "shr"}
_COMPARE = {"==": "eq", "!=": "ne", "<": "lt", ">": "gt", "<=": "le", ">=": "ge"}


EXIT = "\0exit()"  # the format of a printf() that is an exit() (Lowered.printfs)
# print(@m[, top[, div]]), clear(@m), zero(@m): printf()s of no value whose format is
# ACTION + the action, the map's index (and print()'s top and div); the tracer does them,
# when it reads the event (as bpftrace's user space does its own)
ACTION = "\0map "


def map_action(text: str):
    """(action, map index, top, div) of a printf() format that is a map action, else
    None (top 0: every entry; div 1: the values as they are)."""
    if not text.startswith(ACTION):
        return None
    action, index, *limits = text[len(ACTION):].split()
    top, div = map(int, limits) if limits else (0, 1)  # (print() writes both, or neither)
    return action, int(index), top, div


@dataclass
class Lowered:
    """A program's code, one operation list per probe it names (in the order of the
    program's probes), and what the code needs around it."""
    code: Dict[str, List[tuple]]  # probe text -> operations
    strings: List[str]  # constants: string_at N
    locals: int  # words
    key_words: int  # the key buffer's
    scratch: int  # string buffers
    maps: List[map_layout.MapShape] = field(default_factory=list)
    printfs: List[Tuple[str, Tuple[str, ...]]] = field(default_factory=list)  # printf N's
    # (format, value kinds); EXIT's format: an exit() (the tracer ends the run)

    @property
    def uses(self) -> int:
        """What of the context the code reads beyond the arguments (program_file.USES_*)."""
        read = {op[1] for ops in self.code.values() for op in ops if op[0] in ("ctx", "ctx_address")}
        names = {op[0] for ops in self.code.values() for op in ops}
        return (context_uses(read) | USES_PID * bool(names & {"read", "read_string"})
                | USES_EVENT * ("printf" in names) | USES_MAPS)  # (its prologue reads them)

    @property
    def arguments(self) -> int:
        """How many of the context's arguments the code reads (arg0 .. the highest)."""
        return max((op[1] + 1 for ops in self.code.values() for op in ops if op[0] == "arg"),
                   default=0)

    def maps_bytes(self) -> int:
        """The maps area's size."""
        return map_layout.layout(self.maps)[1]

    def initial_maps(self, run: int) -> bytes:
        """The maps file as the tracer creates it for run `run`."""
        return bytes(map_layout.initial_area(self.maps, run))


def lower(checked: Checked, probe_names: Dict[str, Tuple[str, str]] = None,
          map_size: int = map_layout.KEYED_CAPACITY,
          expansions: Dict[str, Dict[str, Tuple[str, str]]] = None) -> Lowered:
    """`probe_names`: probe text -> (the `probe` builtin's value, the `func` one's);
    `map_size`: the entries a map with keys holds; `expansions`: probe text -> the
    values of each probe of a file it stands for (a glob's matches), by a key of
    theirs: the code of a text that reads `probe` or `func` is made once per key too
    (code[key]), with its values."""
    shapes = map_layout.shapes(checked, map_size, name_keys(checked.program))
    lowering = _Lowering(checked, {s.name: i for i, s in enumerate(shapes)},
                         dict(probe_names or {}), shapes)
    code: Dict[str, List[tuple]] = {}
    blocks = [(block, probe.text) for block in checked.program.blocks for probe in block.probes
              if probe.kind not in ("BEGIN", "END")]
    for block, text in blocks:
        lowering.block(block, text, code.setdefault(text, []))
    for text, keys in (expansions or {}).items():
        if text not in lowering.named:
            continue
        for key, names in keys.items():
            lowering.probe_names[key] = names
            for block, of in blocks:
                if of == text:
                    lowering.block(block, key, code.setdefault(key, []))
    for text, ops in code.items():
        code[text] = lowering.registers_first(reuse_lookups(ops, lowering.temp)) + [("return",)]
    shapes = [replace(s, names=tuple(lowering.names)) if map_layout.NAME in s.key_types else s
              for s in shapes]
    return Lowered(code, lowering.strings, max(len(lowering.locals), 1),
                   max((s.key_words for s in shapes), default=1), lowering.scratch, shapes,
                   lowering.printfs)


def name_keys(program) -> Dict[str, Dict[int, str]]:
    """By map, the places of its keys where every key the program writes is the same
    one of the builtins `probe` and `func` (`@[probe] = count()`), and which: a word
    there, the index of the name, where a string is 64 bytes to copy, hash and compare
    at every hit."""
    seen: Dict[Tuple[str, int], Set[str]] = {}
    for node in nodes(program.blocks):
        if isinstance(node, Map):
            for k, key in enumerate(node.keys):
                name = key.name if isinstance(key, Builtin) and key.name in ("probe", "func") \
                    else ""
                seen.setdefault((node.name, k), set()).add(name)
    out: Dict[str, Dict[int, str]] = {}
    for (name, k), kinds in seen.items():
        if len(kinds) == 1 and "" not in kinds:
            out.setdefault(name, {})[k] = kinds.pop()
    return out


class _Lowering:
    def __init__(self, checked: Checked, map_index: Dict[str, int], probe_names, shapes=()):
        self.checked = checked
        self.map_index = map_index
        self.shapes = shapes
        self.probe_names = probe_names
        self.names: List[str] = []  # what NAME keys' indexes name
        self.named = set()  # the probe texts whose code reads `probe` or `func`
        self.strings: List[str] = []
        self.printfs: List[Tuple[str, Tuple[str, ...]]] = []  # format, value kinds
        self.locals: Dict[str, int] = {}
        self.scratch = 0
        self.labels = 0

    def label(self) -> str:
        self.labels += 1
        return f"L{self.labels}"

    def registers_first(self, ops: List[tuple]) -> List[tuple]:
        """`ops` with the floating-point registers they read read at the start, each
        into a local: no call the code makes (an event, a map's lookup, a checked read)
        can change what it sees."""
        used = sorted({op[1] for op in ops if op[0] == "farg"})
        at = {n: self.local(f"\0farg{n}") for n in used}
        return [op for n in used for op in (("farg", n), ("set_local", at[n]))] + \
            [("local", at[op[1]]) if op[0] == "farg" else op for op in ops]

    def string(self, text: str) -> int:
        data = text.encode()[:STRING - 1]
        if data.decode(errors="ignore") not in self.strings:
            self.strings.append(data.decode(errors="ignore"))
        return self.strings.index(data.decode(errors="ignore"))

    # -- blocks and statements ----------------------------------------------------------

    def block(self, block: Block, probe: str, ops: List[tuple]):
        self.ops, self.probe = ops, probe
        # the rule of signs, with each $variable's as the statements so far left it
        self.signer = BlockChecker(self.checked, block, True)
        end = self.label()
        self.block_end = end
        for name in _variables(block.body):  # $x is of one hit: 0 until assigned
            ops += [("const", 0), ("set_local", self.local(name))]
        if block.predicate is not None:
            self.expression(block.predicate)
            ops.append(("jump_zero", end))
        self.statements(block.body)
        ops.append(("label", end))

    def local(self, name: str) -> int:
        return self.locals.setdefault(name, len(self.locals))

    def statements(self, body):
        for statement in body:
            if isinstance(statement, If):
                otherwise, end = self.label(), self.label()
                self.expression(statement.condition)
                self.ops.append(("jump_zero", otherwise))
                self.statements(statement.then)
                self.ops += [("jump", end), ("label", otherwise)]
                self.statements(statement.otherwise)
                self.ops.append(("label", end))
            elif isinstance(statement, Assign):
                self.assign(statement)
            else:
                self.call(statement.expression)

    def assign(self, statement: Assign):
        target, value = statement.target, statement.value
        if isinstance(target, Variable):
            if statement.operator:
                self.ops.append(("local", self.local(target.name)))
                self.expression(value)
                self.arithmetic(statement.operator, target, value)
                sign = self.signed(target) and self.signed(value)
            else:
                self.expression(value)
                sign = self.signed(value)
            self.ops.append(("set_local", self.local(target.name)))
            self.signer.signs[target.name] = sign
            self.signer.variables[target.name] = self.kind(value)
            return
        index = self.map_index[target.name]
        info = self.checked.maps[target.name]
        if isinstance(value, Call) and value.function in map_layout.AGGREGATIONS:
            self.key(target)
            self.ops.append(("entry", index))
            if value.function != "count":
                self.number(value.arguments[0])
            self.ops.append(("update", index, value.function))
            return
        self.key(target)
        self.ops.append(("entry", index))
        if statement.operator:
            self.key(target)
            self.ops += [("find", index), ("load", index)]
            self.expression(value)
            self.arithmetic(statement.operator, target, value)
        else:
            self.expression(value)
        self.ops.append(("update", index, "value"))

    def key(self, target: Map):
        """The key buffer filled with the map's keys: all evaluated first (one may read
        another map, which fills the buffer with its own), then stored, last first."""
        places, word = [], 0
        kinds = self.shapes[self.map_index[target.name]].key_types
        for key, kind in zip(target.keys, kinds):
            if kind == map_layout.NAME:  # (always `probe`, or `func`, there: its index)
                self.named.add(self.probe)
                names = self.probe_names.get(self.probe, (self.probe, ""))
                name = names[0] if key.name == "probe" else names[1]
                # (whole, as bpftrace prints it: a string key's would stop at STRING - 1)
                if name not in self.names:
                    self.names.append(name)
                self.ops.append(("const", self.names.index(name)))
            else:
                self.expression(key)
            places.append(("key_string", word) if kind == STR else ("key_word", word))
            word += STRING // 8 if kind == STR else 1
        self.ops += reversed(places)

    def call(self, call):
        name = call.function
        if name == "delete":
            target = call.arguments[0]
            index = self.map_index[target.name]
            self.key(target)
            self.ops += [("find", index), ("delete", index)]
        elif name == "printf":
            self.printf(call)
        elif name == "exit":  # an event that tells the tracer, then the block ends
            self.printfs.append((EXIT, ()))
            self.ops += [("printf", len(self.printfs) - 1, ()), ("jump", self.block_end)]
        elif name in ("clear", "zero", "print"):
            index = self.map_index[call.arguments[0].name]
            limits = " {} {}".format(*print_limits(call)) if len(call.arguments) > 1 else ""
            self.printfs.append((f"{ACTION}{name} {index}{limits}", ()))
            self.ops.append(("printf", len(self.printfs) - 1, ()))
        else:
            self.expression(call)
            self.ops.append(("drop",))

    def printf(self, call):
        """The values go into an event of the process's ring, the format stays with the
        tracer: an integer is a word, a string its 64 bytes (8 words), 12 words in all."""
        kinds = tuple(_PRINTF_KINDS.get(self.kind(a), "i") for a in call.arguments[1:])
        words = sum(STRING // 8 if k == "s" else 1 for k in kinds)
        if words > ARGUMENTS:
            raise ProgramError(f"printf()'s values take {words} words of an event's "
                               f"{ARGUMENTS} (a string takes {STRING // 8})", call.at)
        for value in call.arguments[1:]:
            self.expression(value)
        self.printfs.append((call.arguments[0].value, kinds))
        self.ops.append(("printf", len(self.printfs) - 1, kinds))

    # -- expressions ----------------------------------------------------------------------

    def is_string(self, expression) -> bool:
        if isinstance(expression, String):
            return True
        if isinstance(expression, Builtin):
            return BUILTINS.get(expression.name) == STR
        if isinstance(expression, Call):
            return expression.function == "str"
        if isinstance(expression, Conditional):
            return self.is_string(expression.then)
        if isinstance(expression, Map):
            return self.checked.maps[expression.name].value == STR
        return False

    def signed(self, expression) -> bool:
        return self.signer.signed(expression)

    def kind(self, expression) -> str:
        """The expression's type (checks.py's INT, STR, or a float's or double's)."""
        return self.signer.type_of(expression)

    def temp(self) -> int:
        """A local of the lowering's own, not shared with another use."""
        return self.local(f"\0{len(self.locals)}")

    def number(self, expression):
        """Pushes an integer: a float or double becomes one toward zero."""
        kind = self.kind(expression)
        self.expression(expression)
        if kind in floats.FLOATS:
            self.ops.append(("float_int", kind))

    def arithmetic(self, operator: str, left, right):
        signed = self.signed(left) and self.signed(right)
        self.ops.append(_binary_op(operator, signed))

    def expression(self, e):
        ops = self.ops
        if isinstance(e, Integer):
            ops.append(("const", e.value & ((1 << 64) - 1)))
        elif isinstance(e, Real):
            ops.append(("const", floats.bits(e.value, floats.F64)))
        elif isinstance(e, String):
            ops.append(("string_at", self.string(e.value)))
        elif isinstance(e, Builtin):
            self.builtin(e)
        elif isinstance(e, Variable):
            ops.append(("local", self.local(e.name)))
        elif isinstance(e, Map):
            index = self.map_index[e.name]
            self.key(e)
            ops.append(("find", index))
            if self.is_string(e):  # (a copy: another thread may be storing a new one)
                ops.append(("load_string", index, self.scratch))
                self.scratch += 1
            else:
                ops.append(("load", index))
        elif isinstance(e, Unary):
            self.expression(e.operand)
            ops.append(("unary", {"-": "neg", "~": "not", "!": "lnot"}[e.operator]))
        elif isinstance(e, Binary):
            self.binary(e)
        elif isinstance(e, Conditional):
            otherwise, end = self.label(), self.label()
            self.expression(e.condition)
            ops.append(("jump_zero", otherwise))
            self.expression(e.then)
            ops += [("jump", end), ("label", otherwise)]
            self.expression(e.otherwise)
            ops.append(("label", end))
        elif isinstance(e, Cast):
            if e.pointer:
                self.expression(e.operand)
            elif e.type == floats.F32 and self.kind(e.operand) == floats.F64:
                self.expression(e.operand)  # (a register that holds a float: its low half)
                ops.append(("cast", 4, False))
            elif e.type in floats.FLOATS:
                self.expression(e.operand)
            else:
                self.number(e.operand)
                size, signed = cast_size(e.type)
                if BlockChecker.narrow(e.operand) < size:  # widened by the new type's sign
                    ops.append(("cast", BlockChecker.narrow(e.operand), signed))
                ops.append(("cast", size, signed))
        elif isinstance(e, Dereference):
            self.expression(e.operand.operand)
            ops.append(("read", *cast_size(e.operand.type)))
        elif isinstance(e, Call) and e.function == "str":
            limit = e.arguments[1].value if len(e.arguments) > 1 else STRING
            if not 1 <= limit <= STRING:
                raise ProgramError(f"str()'s length is 1 to {STRING}", e.arguments[1].at)
            self.expression(e.arguments[0])
            ops.append(("read_string", limit, self.scratch))
            self.scratch += 1
        else:
            raise ProgramError("this expression runs in the tracer only for now",
                               getattr(e, "at", None))

    def builtin(self, e: Builtin):
        name, ops = e.name, self.ops
        if name.startswith("arg"):
            ops.append(("arg", int(name[3:])))
        elif name.startswith("farg") or name == "fretval":
            ops.append(("farg", int(name[4:]) if name != "fretval" else 0))
        elif name == "retval":  # a return probe's one argument
            ops.append(("arg", 0))
        elif name in ("pid", "tid", "nsecs"):
            ops.append(("ctx", {"pid": CTX_PID, "tid": CTX_TID, "nsecs": CTX_NSECS}[name]))
        elif name == "comm":
            ops.append(("ctx_address", CTX_COMM))
        else:  # probe, func: constants of the probe this code runs for
            self.named.add(self.probe)
            probe, function = self.probe_names.get(self.probe, (self.probe, ""))
            ops.append(("string_at", self.string(probe if name == "probe" else function)))

    def binary(self, e: Binary):
        ops = self.ops
        if e.operator in ("&&", "||"):
            short, end = self.label(), self.label()
            self.expression(e.left)
            ops += [("unary", "lnot")] if e.operator == "||" else []
            ops.append(("jump_zero", short))
            self.expression(e.right)
            ops += [("unary", "lnot"), ("unary", "lnot"), ("jump", end), ("label", short),
                    ("const", 1 if e.operator == "||" else 0), ("label", end)]
            return
        kinds = self.kind(e.left), self.kind(e.right)
        if e.operator in _COMPARE and set(kinds) & set(floats.FLOATS):
            return self.float_comparison(e, *kinds)
        self.expression(e.left)
        self.expression(e.right)
        if self.is_string(e.left):
            ops.append(("string_eq",))
            if e.operator == "!=":
                ops.append(("unary", "lnot"))
        elif e.operator in _COMPARE:
            ops.append(("compare", _COMPARE[e.operator], self.signed(e.left) and self.signed(e.right)))
        else:
            ops.append(_binary_op(e.operator, self.signed(e.left) and self.signed(e.right)))


    def float_comparison(self, e: Binary, left: str, right: str):
        """A comparison with a float or a double on a side (checks.py's rules): with a
        number written in the program, or with a value of the same type."""
        ops, operator = self.ops, e.operator
        literal = (Integer, Real)
        if isinstance(e.left, literal) and isinstance(e.right, literal):
            ops.append(("const", int(floats.compared(operator, e.left.value, e.right.value))))
            return
        if isinstance(e.left, literal):
            operator = _MIRRORED[operator]  # (the constant goes to the right)
            e = Binary(operator, e.right, e.left, e.at)
            left, right = right, left
        self.expression(e.left)
        if isinstance(e.right, literal):
            ops.extend(floats.compare_constant(operator, float(e.right.value), left))
            return
        self.expression(e.right)
        ops.extend(floats.compare_values(operator, left, self.temp, self.label))


def _binary_op(operator: str, signed: bool) -> tuple:
    """The operation of a binary operator: >> always shifts in zeros (bpftrace 0.17's, a
    signed value's too: -8 >> 1 is 9223372036854775804 there)."""
    return ("binary", _BINARY[operator], signed and operator != ">>")


_PRINTF_KINDS = {STR: "s", floats.F32: "f32", floats.F64: "f64"}
_MIRRORED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _variables(body) -> List[str]:
    found: List[str] = []
    for statement in body:
        if isinstance(statement, Assign) and isinstance(statement.target, Variable):
            if statement.target.name not in found:
                found.append(statement.target.name)
        elif isinstance(statement, If):
            for name in _variables(statement.then) + _variables(statement.otherwise):
                if name not in found:
                    found.append(name)
    return found


class Frame:
    """The places a probe's function keeps below its frame pointer, the same on every
    architecture: locals, then the key buffer, a printf's values, then the string
    buffers (each STRING bytes); `size` rounded up to 16."""

    def __init__(self, lowered: Lowered):
        self.key = 8 * lowered.locals
        self.event = self.key + 8 * max(lowered.key_words, 1)
        self.scratch = self.event + 8 * ARGUMENTS
        size = self.scratch + STRING * lowered.scratch
        self.size = (size + 15) & ~15

    def local(self, n: int) -> int:
        return 8 * n


def string_data(lowered: Lowered) -> List[str]:
    """The program's string constants as assembly (`string_N:` then STRING bytes each),
    in the syntax both backends' assemblers take."""
    lines = []
    for n, text in enumerate(lowered.strings):
        data = text.encode().ljust(STRING, b"\0")
        lines.append(f"string_{n}:")
        lines += [".byte " + ", ".join(str(b) for b in data[i:i + 16]) for i in range(0, STRING, 16)]
    return lines


@dataclass(frozen=True)
class Fused:
    """The first operations of a list that a backend writes as one (`fused`), saving
    the stack a trip: `operation` (a ("binary", op, signed) or ("compare", cc, signed)
    operation) with its right-hand side `constant` (None: from the stack), and for a
    comparison that only decides a jump, the label jumped to when it is false."""
    taken: int  # operations
    operation: tuple
    constant: Optional[int] = None
    jump_if_false: Optional[str] = None


def leading_predicate(ops: List[tuple]) -> Optional[tuple]:
    """(argument N, constant, comparison, signed) where a probe's code starts with a
    predicate that compares an argument with a constant and, when false, does
    nothing else (a jump to the end): a direct entry checks it before it saves
    anything; (register N, place, comparison, True, kind) where it compares a
    floating-point argument register (fcompare's). None otherwise."""
    registers = {}  # registers_first's: local -> register
    while len(ops) > 1 and ops[0][0] == "farg" and ops[1][0] == "set_local":
        registers[ops[1][1]] = ops[0][1]
        ops = ops[2:]
    ops = [("farg", registers[op[1]]) if op[0] == "local" and op[1] in registers else op
           for op in ops[:1]] + ops[1:]
    names = [op[0] for op in ops[:4]]
    if names[:3] == ["farg", "fcompare", "jump_zero"]:  # a floating-point register's
        end, (_, kind, comparison, place) = ops[2][1], ops[1]
        found = ops[0][1], place, comparison, True, kind
    elif names == ["arg", "const", "compare", "jump_zero"]:
        end = ops[3][1]
        found = ops[0][1], ops[1][1], ops[2][1], ops[2][2]
    else:
        return None
    rest = ops[ops.index(("label", end)) + 1:] if ("label", end) in ops else None
    return found if rest == [("return",)] else None


def fused(ops: List[tuple]) -> Optional[Fused]:
    """What the first of `ops` do as one, or None."""
    constant = len(ops) > 1 and ops[0][0] == "const" and ops[1][0] in ("binary", "compare")
    rest = ops[1:] if constant else ops
    value = ops[0][1] if constant else None
    if len(rest) > 1 and rest[0][0] == "compare" and rest[1][0] == "jump_zero":
        return Fused(constant + 2, rest[0], value, rest[1][1])
    return Fused(2, rest[0], value) if constant else None
