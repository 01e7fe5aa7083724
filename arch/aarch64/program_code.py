"""arm64 code for a lowered probe program (programs/lower.py's stack machine).

Each probe's code is an AAPCS64 function, `void code(context *)`, with the x86_64
one's contract (arch/x86_64/program_code.py): the same context, maps and hash, so
that the tracer reads what either wrote. x19 holds the context, x20 the maps area,
x29 the frame (locals, the key buffer, a printf's values, the string scratch
buffers); the machine's stack is sp, 16 bytes a word (sp stays 16-aligned, as
arm64 requires of every access through it). Counters and values are updated with
exclusive pairs (ldxr/stxr: ARMv8.0 has no atomic add).

Memory the program names (pointer reads, str()) is read by read_memory with
process_vm_readv (270) on the process itself, as on x86_64. Where the system has
none (qemu-user answers ENOSYS), through a pipe of the read's own: write() checks
the address and fails with EFAULT instead of faulting, read() takes the bytes back.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from urewrite.programs import floats
from urewrite.programs import lower as L
from urewrite.programs import maps as M
from urewrite.trampolines import program_file as P

SYS_PROCESS_VM_READV = 270
SYS_PIPE2, SYS_WRITE, SYS_READ, SYS_CLOSE = 59, 64, 63, 57
ENOSYS = 38
O_CLOEXEC = 0x80000
PAGE = 4096
HASH_MULTIPLIER = M.HASH_MULTIPLIER
_SIGN_EXTEND = {4: "sxtw", 2: "sxth", 1: "sxtb"}
_MASK = {2: "0xffff", 1: "0xff"}
_SIGNED_CC = {"eq": "eq", "ne": "ne", "lt": "lt", "gt": "gt", "le": "le", "ge": "ge"}
_UNSIGNED_CC = {"eq": "eq", "ne": "ne", "lt": "lo", "gt": "hi", "le": "ls", "ge": "hs"}
_NEGATED = {"eq": "ne", "ne": "eq", "lt": "ge", "ge": "lt", "gt": "le", "le": "gt",
            "lo": "hs", "hs": "lo", "hi": "ls", "ls": "hi"}
_PUSH = "str x0, [sp, #-16]!"


def _pop(reg: str) -> str:
    return f"ldr {reg}, [sp], #16"


def assemble(lowered: L.Lowered, offsets: List[int]) -> Tuple[bytes, Dict[str, int]]:
    """The code of every probe, and where each probe's function starts in it."""
    from urewrite.arch.runtime_asm import assemble_with_starts

    text, entries = source(lowered, offsets)
    code, starts = assemble_with_starts(text + ".p2align 3\n", list(entries.values()), 0,
                                        "KS_ARCH_ARM64", "KS_MODE_LITTLE_ENDIAN",
                                        "a probe program")
    return code, dict(zip(entries, starts))


def source(lowered: L.Lowered, offsets: List[int]) -> Tuple[str, Dict[str, str]]:
    """The assembly text, and each probe's function label."""
    frame = L.Frame(lowered)
    lines: List[str] = []
    entries = {}
    labels = _Labels()
    for k, (probe, ops) in enumerate(lowered.code.items()):
        label = f"probe_{k}"
        entries[probe] = label
        lines += _function(label, ops, frame, lowered, labels)
    for index, shape in enumerate(lowered.maps):
        lines += _lookup(index, shape, offsets[index])
    lines += _read_memory()
    lines.append(".p2align 4")
    lines += L.string_data(lowered)
    return "".join(line + "\n" for line in lines), entries


class _Labels:
    def __init__(self):
        self.count = 0

    def __call__(self, fn: str) -> str:
        self.count += 1
        return f"{fn}_u{self.count}"


def _mov(reg: str, value: int) -> List[str]:
    """reg = a 64-bit constant, in movz/movn and movk."""
    value &= (1 << 64) - 1
    chunks = [value >> (16 * i) & 0xFFFF for i in range(4)]
    if value == 0:
        return [f"mov {reg}, xzr"]
    inverted = chunks.count(0xFFFF) > chunks.count(0)
    skip = 0xFFFF if inverted else 0
    out = []
    for i, chunk in enumerate(chunks):
        if chunk == skip:
            continue
        if not out:
            first = (~chunk & 0xFFFF) if inverted else chunk
            out.append(f"{'movn' if inverted else 'movz'} {reg}, #{first:#x}, lsl #{16 * i}")
        else:
            out.append(f"movk {reg}, #{chunk:#x}, lsl #{16 * i}")
    return out or [f"movn {reg}, #0"]


def _add(reg: str, base: str, offset: int) -> List[str]:
    """reg = base + a non-negative offset."""
    if offset < 4096:
        return [f"add {reg}, {base}, #{offset}"]
    if offset < 1 << 24:
        out = [f"add {reg}, {base}, #{offset >> 12}, lsl #12"]
        return out + ([f"add {reg}, {reg}, #{offset & 0xFFF}"] if offset & 0xFFF else [])
    return _mov(reg, offset) + [f"add {reg}, {base}, {reg}"]


def _increment(address: str, by: str, fn: str, labels: _Labels) -> List[str]:
    """[address] += by (a register, or #1), exclusive. Clobbers x16, x17."""
    again = labels(fn)
    return [f"{again}:", f"ldxr x16, [{address}]", f"add x16, x16, {by}",
            f"stxr w17, x16, [{address}]", f"cbnz w17, {again}"]


def _fault(fn: str, labels: _Labels) -> List[str]:
    """Counts a memory read that found nothing to read."""
    return ["add x15, x20, #%d" % M.FAULTS] + _increment("x15", "#1", fn, labels)


def _function(label: str, ops, frame: L.Frame, lowered: L.Lowered, labels: _Labels) -> List[str]:
    body: List[str] = []
    k = 0
    while k < len(ops):
        lines, taken = _fused(label, ops[k:k + 3])
        if not taken:
            lines, taken = _operation(label, ops[k], frame, lowered, labels), 1
        body += lines
        k += taken
    body = _without_stack_moves(body)
    # run_program calls it through a register: a landing pad (bti c), for a program
    # built into a file whose pages are BTI-guarded
    return [f"{label}:", "hint #34", "stp x29, x30, [sp, #-16]!", "stp x19, x20, [sp, #-16]!",
            "stp x21, x22, [sp, #-16]!", "mov x19, x0", f"ldr x20, [x19, #{P.CTX_MAPS}]"] + \
        _sub("sp", "sp", frame.size) + ["mov x29, sp"] + body + [
        f"{label}_return:", "mov sp, x29"] + _add("sp", "sp", frame.size) + [
        "ldp x21, x22, [sp], #16", "ldp x19, x20, [sp], #16", "ldp x29, x30, [sp], #16", "ret"]


def _sub(reg: str, base: str, amount: int) -> List[str]:
    """reg = base - amount, for 0 <= amount < 2**24."""
    out = []
    if amount >> 12:
        out.append(f"sub {reg}, {base}, #{amount >> 12}, lsl #12")
        base = reg
    if amount & 0xFFF:
        out.append(f"sub {reg}, {base}, #{amount & 0xFFF}")
    return out


def _fused(fn: str, ops) -> Tuple[List[str], int]:
    """The first operations as one where lower.fused says so, and how many it took:
    0 for none."""
    f = L.fused(ops)
    if f is None:
        return [], 0
    name, *args = f.operation
    operands = [_pop("x0")] + _mov("x1", f.constant) if f.constant is not None \
        else [_pop("x1"), _pop("x0")]
    if f.jump_if_false is not None:
        cc = condition(args[0], args[1])
        return operands + ["cmp x0, x1", f"b.{_NEGATED[cc]} {fn}_{f.jump_if_false}"], f.taken
    if name == "binary":
        return operands + _binary(*args) + [_PUSH], f.taken
    cc = condition(args[0], args[1])
    return operands + ["cmp x0, x1", f"cset x0, {cc}", _PUSH], f.taken


def _without_stack_moves(lines: List[str]) -> List[str]:
    """A push of x0 then a pop as one move (none where it pops into x0)."""
    out: List[str] = []
    for line in lines:
        if out and out[-1] == _PUSH and line.startswith("ldr ") and line.endswith(", [sp], #16"):
            target = line[4:line.index(",")]
            out.pop()
            if target != "x0":
                out.append(f"mov {target}, x0")
            continue
        out.append(line)
    return out


def _operation(fn: str, op: tuple, frame: L.Frame, lowered: L.Lowered, labels: _Labels) -> List[str]:
    name, args = op[0], op[1:]
    if name == "const":
        return _mov("x0", args[0]) + [_PUSH]
    if name == "ctx":
        return [f"ldr x0, [x19, #{args[0]}]", _PUSH]
    if name == "ctx_address":
        return [f"add x0, x19, #{args[0]}", _PUSH]
    if name == "arg":
        n = args[0]
        return ([f"ldr x0, [x19, #{P.CTX_ARGS + 8 * n}]"] if n < P.ARGUMENTS else
                ["mov x0, xzr"]) + [_PUSH]
    if name == "farg":  # (a read: no floating-point state changes)
        return [f"fmov x0, d{args[0]}", _PUSH]
    if name == "float_int":
        return _float_integer(fn, args[0], labels)
    if name == "fcompare":
        true, false, nan, end = (labels(fn) for _ in range(4))
        return [_pop("x0")] + float_test(*args, "x0", "x1", true, false, nan) + [
            f"{true}:", "mov x0, #1", f"b {end}", f"{false}:", "mov x0, #0", f"{end}:", _PUSH]
    if name == "local":
        return [f"ldr x0, [x29, #{frame.local(args[0])}]", _PUSH]
    if name == "set_local":
        return [_pop("x0"), f"str x0, [x29, #{frame.local(args[0])}]"]
    if name == "unary":
        if args[0] == "lnot":
            return [_pop("x0"), "cmp x0, #0", "cset x0, eq", _PUSH]
        return [_pop("x0"), "neg x0, x0" if args[0] == "neg" else "mvn x0, x0", _PUSH]
    if name == "binary":
        return [_pop("x1"), _pop("x0")] + _binary(*args) + [_PUSH]
    if name == "compare":
        cc = condition(args[0], args[1])
        return [_pop("x1"), _pop("x0"), "cmp x0, x1", f"cset x0, {cc}", _PUSH]
    if name == "cast":
        return [_pop("x0")] + _extend(*args) + [_PUSH]
    if name == "read":
        size, signed = args
        read = labels(fn)
        return [_pop("x0"), "str xzr, [sp, #-16]!", "mov x1, sp", f"mov x2, #{size}",
                "bl read_memory", f"cmp x0, #{size}", f"b.eq {read}"] + _fault(fn, labels) + \
            [f"{read}:", _pop("x0")] + _extend(size, signed) + [_PUSH]
    if name == "string_at":
        return [f"adr x0, string_{args[0]}", _PUSH]
    if name == "read_string":
        return _read_string(fn, frame.scratch + L.STRING * args[1], args[0], labels)
    if name == "string_eq":
        return _string_equal(fn, labels)
    if name == "jump":
        return [f"b {fn}_{args[0]}"]
    if name == "jump_zero":
        return [_pop("x0"), f"cbz x0, {fn}_{args[0]}"]
    if name == "label":
        return [f"{fn}_{args[0]}:"]
    if name == "drop":
        return ["add sp, sp, #16"]
    if name == "key_word":
        return [_pop("x0"), f"str x0, [x29, #{frame.key + 8 * args[0]}]"]
    if name == "key_string":
        return [_pop("x1")] + _add("x9", "x29", frame.key + 8 * args[0]) + _copy_string("x1", "x9")
    if name in ("entry", "find"):
        return _add("x0", "x29", frame.key) + [f"mov w1, #{int(name == 'entry')}",
                                                f"bl map_{args[0]}", _PUSH]
    if name == "update":
        return _update(fn, lowered.maps[args[0]], args[1], labels)
    if name == "load":
        return _load(fn, lowered.maps[args[0]], labels)
    if name == "load_string":
        return _load_string(fn, lowered.maps[args[0]], frame.scratch + L.STRING * args[1],
                            labels)
    if name == "delete":
        return _delete(fn, lowered.maps[args[0]], labels)
    if name == "printf":
        return _printf(frame, *args)
    if name == "return":
        return [f"b {fn}_return"]
    raise ValueError(f"unknown operation {op}")


def _binary(op: str, signed: bool) -> List[str]:
    """x0 = x0 OP x1. arm64's divisions give 0 for a division by zero (so the
    remainder is the dividend, as eBPF's) and wrap INT64_MIN / -1: no trap, no branch."""
    if op in ("add", "sub", "and"):
        return [f"{op} x0, x0, x1"]
    if op in ("or", "xor"):
        return [f"{'orr' if op == 'or' else 'eor'} x0, x0, x1"]
    if op == "mul":
        return ["mul x0, x0, x1"]
    if op == "shl":
        return ["lsl x0, x0, x1"]
    if op == "shr":
        return ["asr x0, x0, x1" if signed else "lsr x0, x0, x1"]
    divide = "sdiv" if signed else "udiv"
    if op == "div":
        return [f"{divide} x0, x0, x1"]
    return [f"{divide} x2, x0, x1", "msub x0, x2, x1, x0"]


def _extend(size: int, signed: bool, register: str = "x0") -> List[str]:
    """The low `size` bytes of `register` sign- or zero-extended."""
    if size == 8:
        return []
    w = "w" + register[1:]
    if signed:
        return [f"{_SIGN_EXTEND[size]} {register}, {w}"]
    return [f"mov {w}, {w}" if size == 4 else f"and {register}, {register}, #{_MASK[size]}"]


def condition(comparison: str, signed: bool) -> str:
    """The condition code of a comparison (lower's eq, lt, ...)."""
    return (_SIGNED_CC if signed else _UNSIGNED_CC)[comparison]


def _float_integer(fn: str, kind: str, labels: _Labels) -> List[str]:
    """The float's or double's word on the stack as an integer toward zero (NaN 0,
    saturating: floats.truncated), in integer instructions: the exponent, then the
    mantissa with its hidden bit shifted by it."""
    exponent_bits, mantissa_bits, bias = floats.layout(kind)
    top = (1 << exponent_bits) - 1
    sign = (32 if kind == floats.F32 else 64) - 1
    zero, big, right, signed, positive, saturate, done = (labels(fn) for _ in range(7))
    return [_pop("x0"), f"ubfx x1, x0, #{mantissa_bits}, #{exponent_bits}",
            f"cmp x1, #{bias}", f"b.lo {zero}",  # |value| < 1
            f"cmp x1, #{bias + 63}", f"b.hs {big}",
            f"ubfx x2, x0, #0, #{mantissa_bits}", f"orr x2, x2, #{1 << mantissa_bits:#x}",
            f"sub x3, x1, #{bias + mantissa_bits}",
            f"cmp x1, #{bias + mantissa_bits}", f"b.lo {right}",
            "lsl x2, x2, x3", f"b {signed}",
            f"{right}:", "neg x3, x3", "lsr x2, x2, x3",
            f"{signed}:", f"tbz x0, #{sign}, {positive}", "neg x2, x2",
            f"{positive}:", "mov x0, x2", f"b {done}",
            f"{big}:", f"cmp x1, #{top}", f"b.ne {saturate}",  # infinity or NaN?
            f"ubfx x2, x0, #0, #{mantissa_bits}", f"cbnz x2, {zero}",
            f"{saturate}:", f"lsr x0, x0, #{sign}"] + _mov("x1", floats.INT64_MAX) + [
            "add x0, x0, x1", f"b {done}",  # INT64_MAX, or INT64_MIN if negative
            f"{zero}:", "mov x0, #0", f"{done}:", _PUSH]


def float_test(kind: str, comparison: str, place: int, value: str, scratch: str,
               true: str, false: str, nan: str) -> List[str]:
    """On to `true` if the float's or double's word in `value` is not NaN and
    floats.ordered() of it compares so with `place` (lower's fcompare), else to
    `false` (to `true` for a NaN and ne); integer instructions only. `value` and
    `scratch` are clobbered, the flags too."""
    out = [f"lsl {value}, {value}, #32"] if kind == floats.F32 else []  # (its sign on top)
    out += [f"asr {scratch}, {value}, #63", f"and {value}, {value}, #0x7fffffffffffffff",
            f"eor {value}, {value}, {scratch}", f"sub {value}, {value}, {scratch}"]
    out += _mov(scratch, floats.infinity_place(kind)) + [
        f"cmp {value}, {scratch}", f"b.gt {nan}", f"neg {scratch}, {scratch}",
        f"cmp {value}, {scratch}", f"b.lt {nan}"]
    out += _mov(scratch, floats.top_aligned(place, kind)) + [
        f"cmp {value}, {scratch}", f"b.{condition(comparison, True)} {true}", f"b {false}",
        f"{nan}:", f"b {true if comparison == 'ne' else false}"]
    return out


def _copy_string(source: str, target: str) -> List[str]:
    """The 64 bytes at `source` to `target`. Clobbers x2, x3."""
    out = []
    for i in range(0, L.STRING, 16):
        out += [f"ldp x2, x3, [{source}, #{i}]", f"stp x2, x3, [{target}, #{i}]"]
    return out


def _read_memory() -> List[str]:
    """read_memory(x0 = address, x1 = buffer, x2 = length) -> x0 = the bytes read, or
    < 0. A leaf: clobbers x1-x5, x8-x14 (system calls keep all but x0)."""
    return [
        "read_memory:", "mov x9, x0", "mov x10, x1", "mov x11, x2", "sub sp, sp, #32",
        "stp x10, x11, [sp]", "stp x9, x11, [sp, #16]",  # local {buffer, n}, remote {address, n}
        f"ldr x0, [x19, #{P.CTX_PID}]", "mov x1, sp", "mov x2, #1", "add x3, sp, #16",
        "mov x4, #1", "mov x5, #0", f"mov x8, #{SYS_PROCESS_VM_READV}", "svc #0",
        f"cmn x0, #{ENOSYS}", "b.ne read_memory_done",
        # no process_vm_readv: a pipe of this read's own
        "mov x0, sp", f"movz x1, #{O_CLOEXEC >> 16}, lsl #16", f"mov x8, #{SYS_PIPE2}", "svc #0",
        "tbnz x0, #63, read_memory_done",
        "ldp w12, w13, [sp]",  # the ends: read, write
        "mov x0, x13", "mov x1, x9", "mov x2, x11", f"mov x8, #{SYS_WRITE}", "svc #0",
        "mov x14, x0", "cmp x14, #0", "b.le read_memory_close",
        "mov x0, x12", "mov x1, x10", "mov x2, x14", f"mov x8, #{SYS_READ}", "svc #0",
        "mov x14, x0",
        "read_memory_close:", "mov x0, x12", f"mov x8, #{SYS_CLOSE}", "svc #0",
        "mov x0, x13", f"mov x8, #{SYS_CLOSE}", "svc #0", "mov x0, x14",
        "read_memory_done:", "add sp, sp, #32", "ret"]


def _read_string(fn: str, buffer: int, limit: int, labels: _Labels) -> List[str]:
    """str(address, limit): at most limit - 1 bytes and a NUL into the buffer, which
    is cleared first; a read that fails is tried again up to the end of its page (a
    string near the end of its mapping)."""
    done, short = labels(fn), labels(fn)
    out = [_pop("x21")] + _add("x9", "x29", buffer)
    out += [f"stp xzr, xzr, [x9, #{i}]" for i in range(0, L.STRING, 16)]
    for attempt in range(2):
        if attempt:  # up to the page's end
            out += [f"and x9, x21, #{PAGE - 1}", f"mov x2, #{PAGE}", "sub x2, x2, x9",
                    f"cmp x2, #{limit}", f"b.ls {short}", f"mov x2, #{limit}", f"{short}:"]
        else:
            out.append(f"mov x2, #{limit}")
        out += ["mov x0, x21"] + _add("x1", "x29", buffer) + ["bl read_memory", "cmp x0, #0",
                                                             f"b.gt {done}"]
    out += _fault(fn, labels)
    # what the read took past the string's end is not the string's: keys and
    # comparisons take all 64 bytes
    scan, clear, end = labels(fn), labels(fn), labels(fn)
    out += [f"{done}:"] + _add("x9", "x29", buffer) + [
        f"strb wzr, [x9, #{limit - 1}]", f"add x10, x9, #{L.STRING}",
        f"{scan}:", "ldrb w11, [x9]", f"cbz w11, {clear}", "add x9, x9, #1", f"b {scan}",
        f"{clear}:", "cmp x9, x10", f"b.hs {end}", "strb wzr, [x9], #1", f"b {clear}",
        f"{end}:"] + _add("x0", "x29", buffer) + [_PUSH]
    return out


def _string_equal(fn: str, labels: _Labels) -> List[str]:
    differ, done = labels(fn), labels(fn)
    out = [_pop("x1"), _pop("x0")]
    for i in range(0, L.STRING, 16):
        out += [f"ldp x2, x3, [x0, #{i}]", f"ldp x4, x5, [x1, #{i}]", "cmp x2, x4",
                "ccmp x3, x5, #0, eq", f"b.ne {differ}"]
    return out + ["mov x0, #1", f"b {done}", f"{differ}:", "mov x0, xzr", f"{done}:", _PUSH]


def _printf(frame: L.Frame, index: int, kinds) -> List[str]:
    """The values, popped last first into the event buffer, then the runtime's routine
    (an AAPCS64 function: w0 = printf N, x1 = the words, x2 = how many)."""
    at, word = [], 0
    for kind in kinds:
        at.append(word)
        word += M.STRING_WORDS if kind == "s" else 1
    out = []
    for kind, first in reversed(list(zip(kinds, at))):
        base = frame.event + 8 * first
        if kind == "s":
            out += [_pop("x1")] + _add("x9", "x29", base) + _copy_string("x1", "x9")
        else:
            out += [_pop("x0"), f"str x0, [x29, #{base}]"]
    return out + [f"ldr x9, [x19, #{P.CTX_EVENT}]", f"mov w0, #{index}"] + \
        _add("x1", "x29", frame.event) + [f"mov x2, #{word}", "blr x9"]


_VALUE = 8 * M.ENTRY_HEAD  # the value words, past state and present


def _value_at(shape: M.MapShape) -> int:
    return _VALUE + 8 * shape.key_words


def _update(fn: str, shape: M.MapShape, kind: str, labels: _Labels) -> List[str]:
    """Pops the value (x1; none for count) and the entry (x0, 0: none)."""
    skip = labels(fn)
    out = [] if kind == "count" else [_pop("x1")]
    out += [_pop("x0"), f"cbz x0, {skip}"] + _add("x9", "x0", _value_at(shape))
    if kind == "count":
        out += _increment("x9", "#1", fn, labels)
    elif kind == "sum":
        out += _increment("x9", "x1", fn, labels)
    elif kind in ("avg", "stats"):
        out += _increment("x9", "#1", fn, labels) + ["add x9, x9, #8"] + \
            _increment("x9", "x1", fn, labels)
    elif kind in ("min", "max"):
        again, kept, done = labels(fn), labels(fn), labels(fn)
        keep = "ge" if kind == "min" else "le"  # the stored one stays
        out += [f"{again}:", "ldxr x10, [x9]", "cmp x1, x10", f"b.{keep} {kept}",
                "stxr w11, x1, [x9]", f"cbnz w11, {again}", f"b {done}",
                f"{kept}:", "clrex", f"{done}:"]
    elif kind == "hist":
        bucket = labels(fn)
        out += ["mov x2, xzr", f"tbnz x1, #63, {bucket}", "mov x2, #1", f"cbz x1, {bucket}",
                "clz x2, x1", "mov x3, #65", "sub x2, x3, x2",  # floor(log2) + 2
                f"{bucket}:", "add x9, x9, x2, lsl #3"] + _increment("x9", "#1", fn, labels)
    elif kind == "lhist":
        low, high, step = shape.lhist
        last = (high - low) // step + 1
        bucket = labels(fn)
        out += ["mov x2, xzr"] + _mov("x3", low) + ["cmp x1, x3", f"b.lt {bucket}"] + \
            _mov("x2", last) + _mov("x4", high) + ["cmp x1, x4", f"b.ge {bucket}",
                                                   "sub x1, x1, x3"] + \
            _mov("x4", step) + ["udiv x2, x1, x4", "add x2, x2, #1", f"{bucket}:",
                                "add x9, x9, x2, lsl #3"] + _increment("x9", "#1", fn, labels)
    elif kind == "value" and shape.holds_strings:  # x1: the string's address
        out += _copy_string("x1", "x9")
    elif kind == "value":
        out.append("str x1, [x9]")
    else:
        raise ValueError(f"unknown aggregation {kind}")
    return out + ["mov x10, #1", "str x10, [x0, #8]", f"{skip}:"]


def _load(fn: str, shape: M.MapShape, labels: _Labels) -> List[str]:
    """An entry's value, 0 for none: an avg() map's mean, rounded toward zero."""
    done = labels(fn)
    out = [_pop("x9"), "mov x0, xzr", f"cbz x9, {done}", "ldr x10, [x9, #8]", "cmp x10, #1",
           f"b.ne {done}"] + _add("x9", "x9", _value_at(shape))
    if shape.kind == "avg":
        out += ["ldr x10, [x9]", f"cbz x10, {done}", "ldr x0, [x9, #8]", "sdiv x0, x0, x10"]
    else:
        out.append("ldr x0, [x9]")
    return out + [f"{done}:", _PUSH]


def _load_string(fn: str, shape: M.MapShape, buffer: int, labels: _Labels) -> List[str]:
    """A map of strings' value, copied into the scratch buffer at x29 + `buffer` ("" for
    none): its address."""
    empty, done = labels(fn), labels(fn)
    out = [_pop("x9")] + _add("x0", "x29", buffer) + [
        f"cbz x9, {empty}", "ldr x10, [x9, #8]", "cmp x10, #1", f"b.ne {empty}"]
    out += _add("x9", "x9", _value_at(shape)) + _copy_string("x9", "x0") + [f"b {done}",
                                                                          f"{empty}:"]
    out += [f"stp xzr, xzr, [x0, #{i}]" for i in range(0, L.STRING, 16)]
    return out + [f"{done}:", _PUSH]


def _delete(fn: str, shape: M.MapShape, labels: _Labels) -> List[str]:
    skip = labels(fn)
    out = [_pop("x0"), f"cbz x0, {skip}", "str xzr, [x0, #8]"] + \
        _add("x9", "x0", _value_at(shape)) + _mov("x10", shape.initial or 0)
    out += [f"str {'x10' if i == 0 else 'xzr'}, [x9, #{8 * i}]" for i in range(shape.value_words)]
    return out + [f"{skip}:"]


def _lookup(index: int, shape: M.MapShape, offset: int) -> List[str]:
    """map_N(x0 = key buffer, w1 = 1 to make a missing entry) -> x0 = the entry, or 0
    (missing, or the table is full: counted in its header). A leaf: clobbers x2-x17.
    The entry's state is read with acquire and published with release, so that a key
    is seen written before its state says so."""
    fn = f"map_{index}"
    words = shape.key_words
    entry_bytes = 8 * shape.entry_words
    out = [f"{fn}:"] + _mov("x10", offset) + ["add x9, x20, x10"]  # the table
    # the hash of the key's words, odd: a claimed entry's state
    out += _mov("x11", HASH_MULTIPLIER) + ["mov x12, x11"]
    for i in range(words):
        out += [f"ldr x13, [x0, #{8 * i}]", "eor x12, x12, x13", "mul x12, x12, x11"]
    out += ["eor x12, x12, x12, lsr #29", "orr x12, x12, #1"]  # (maps.entry_state)
    out += _mov("x14", shape.capacity - 1)
    if words == 1 and shape.capacity > 1:  # the first slot (maps.first_slot)
        out += ["ldr x13, [x0]", "mul x13, x13, x11",
                f"lsr x13, x13, #{64 - (shape.capacity.bit_length() - 1)}"]
    else:
        out += ["and x13, x12, x14"]
    out += _mov("x15", shape.capacity)  # slots left to look at
    out += _mov("x2", entry_bytes)
    out += [f"{fn}_slot:", "madd x16, x13, x2, x9", f"add x16, x16, #{8 * M.HEADER_WORDS}",
            f"{fn}_state:", "ldar x17, [x16]",
            "cmp x17, x12", f"b.eq {fn}_compare",
            f"cbz x17, {fn}_free",
            "cmp x17, #2", f"b.ne {fn}_next",
            "yield", f"b {fn}_state",  # being claimed: its key comes next
            f"{fn}_compare:"]
    for i in range(words):
        out += [f"ldr x3, [x0, #{8 * i}]", f"ldr x4, [x16, #{8 * (M.ENTRY_HEAD + i)}]",
                "cmp x3, x4", f"b.ne {fn}_next"]
    out += ["mov x0, x16", "ret",
            f"{fn}_free:", f"cbz w1, {fn}_missing",
            f"{fn}_claim:", "ldaxr x17, [x16]", f"cbnz x17, {fn}_lost", "mov x3, #2",
            "stxr w4, x3, [x16]", f"cbnz w4, {fn}_claim"]
    for i in range(words):
        out += [f"ldr x3, [x0, #{8 * i}]", f"str x3, [x16, #{8 * (M.ENTRY_HEAD + i)}]"]
    if shape.initial is not None:
        out += _mov("x3", shape.initial) + [f"str x3, [x16, #{8 * (M.ENTRY_HEAD + words)}]"]
    out += ["stlr x12, [x16]", "mov x0, x16", "ret",  # published: the key before it
            f"{fn}_lost:", "clrex", f"b {fn}_state",
            f"{fn}_next:", "add x13, x13, #1", "and x13, x13, x14", "subs x15, x15, #1",
            f"b.ne {fn}_slot", f"cbz w1, {fn}_missing",
            "add x3, x9, #32"]  # dropped
    out += [f"{fn}_drop:", "ldxr x4, [x3]", "add x4, x4, #1", "stxr w5, x4, [x3]",
            f"cbnz w5, {fn}_drop",
            f"{fn}_missing:", "mov x0, xzr", "ret"]
    return out
