"""x86_64 code for a lowered probe program (programs/lower.py's stack machine).

Each probe's code is a function of the SysV ABI, `void code(context *)`, that keeps
the machine's stack on its own: every operation pops its operands and pushes its
result. rbx holds the context, r12 the maps area, rbp the frame (locals, the key
buffer, the string scratch buffers). A map's lookup is a function of its own per
map, shared by the probes' code. Memory the program names (pointer reads, str())
is read with process_vm_readv on the process itself: an address that is not
readable gives 0 or "", never a fault.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from urewrite.programs import floats
from urewrite.programs import lower as L
from urewrite.programs import maps as M
from urewrite.trampolines import program_file as P

_SAVED = ("rbx", "rbp", "r12", "r13", "r14", "r15")  # SysV's: those the code uses are saved
_ALWAYS_SAVED = ("rbx", "rbp", "r12")  # the context, the frame, the maps
_NEGATED = {"e": "ne", "ne": "e", "l": "ge", "ge": "l", "g": "le", "le": "g",
            "b": "ae", "ae": "b", "a": "be", "be": "a"}
_SIGNED_CC = {"eq": "e", "ne": "ne", "lt": "l", "gt": "g", "le": "le", "ge": "ge"}
_UNSIGNED_CC = {"eq": "e", "ne": "ne", "lt": "b", "gt": "a", "le": "be", "ge": "ae"}
SYS_PROCESS_VM_READV = 310
HASH_MULTIPLIER = M.HASH_MULTIPLIER


def assemble(lowered: L.Lowered, offsets: List[int]) -> Tuple[bytes, Dict[str, int]]:
    """The code of every probe, and where each probe's function starts in it."""
    from urewrite.arch.runtime_asm import assemble_with_starts

    text, entries = source(lowered, offsets)
    code, starts = assemble_with_starts(text, list(entries.values()), 0, "KS_ARCH_X86",
                                        "KS_MODE_64", "a probe program")
    return code, dict(zip(entries, starts))


def source(lowered: L.Lowered, offsets: List[int]) -> Tuple[str, Dict[str, str]]:
    """The assembly text, and each probe's function label."""
    frame = L.Frame(lowered)
    lines: List[str] = []
    entries = {}
    for k, (probe, ops) in enumerate(lowered.code.items()):
        label = f"probe_{k}"
        entries[probe] = label
        lines += _function(label, ops, frame, lowered, offsets)
    for index, shape in enumerate(lowered.maps):
        lines += _lookup(index, shape, offsets[index])
    lines.append(".align 64")
    lines += L.string_data(lowered)
    return "".join(line + "\n" for line in lines), entries


def _function(label: str, ops, frame: L.Frame, lowered: L.Lowered,
              offsets: List[int]) -> List[str]:
    hot, cold = _function_parts(label, ops, frame, lowered, offsets)
    return hot + ["ret"] + cold


def function_parts(label: str, ops, lowered: L.Lowered, offsets: List[int]) -> tuple:
    """(what a hit runs, up to the function's `ret` and without it; what it seldom
    runs, after): a probe's function as code another's text may hold in line (a direct
    entry: direct_entry.assemble_with_code), its labels made from `label`."""
    return _function_parts(label, ops, L.Frame(lowered), lowered, offsets)


def quick_update(ops, lowered: L.Lowered, offsets: List[int], full: str) -> \
        Optional[List[str]]:
    """Code that only adds to one map entry whose place is known when compiled
    (`@[probe] = count()`, `@n = count()`, `@s = sum(5)`), as a direct entry can run it
    before it saves anything or makes a context: the maps in rcx, no other register and
    no stack (in a server, a hit's stack stores cost more than the add: they must
    reach the cache before the `lock`ed add completes). On to `full` (the function,
    with its lookup) where the entry is not there yet. None for any other code."""
    ops = list(ops)
    if len(ops) >= 2 and ops[-1] == ("return",) and ops[-2][0] == "label":
        ops = ops[:-2]  # (the function's end: nothing jumps to it here)
    key = None
    if len(ops) >= 2 and ops[0][0] == "const" and ops[1] == ("key_word", 0):
        key, ops = ops[0][1] & (2**64 - 1), ops[2:]
    if len(ops) < 2 or ops[0][0] != "entry":
        return None
    index = ops[0][1]
    shape = lowered.maps[index]
    if shape.key_words != (0 if key is None else 1) or shape.initial is not None:
        return None
    if key is not None and key >= 1 << 31:
        return None
    at = _known_entry(shape, offsets[index], key)
    value = at + _value_at(shape)
    if ops[1:] == [("update", index, "count")]:
        add = f"lock inc qword ptr [rcx + {value}]"
    elif len(ops) == 3 and ops[1][0] == "const" and ops[2] == ("update", index, "sum") \
            and -(1 << 31) <= ops[1][1] < 1 << 31:
        add = f"lock add qword ptr [rcx + {value}], {ops[1][1]}"
    else:
        return None
    # claimed (its state odd) and by this key, as _one_word_lookup checks it
    out = [f"test byte ptr [rcx + {at}], 1", f"jz {full}"]
    if key is not None:
        out += [f"cmp qword ptr [rcx + {at + 8 * M.ENTRY_HEAD}], {key}", f"jne {full}"]
    return out + [add, f"mov qword ptr [rcx + {at + 8}], 1"]


def _function_parts(label: str, ops, frame: L.Frame, lowered: L.Lowered,
                    offsets: List[int]) -> tuple:
    body: List[str] = []
    cold: List[str] = []  # what a hit seldom runs, after the function's `ret`, so that
    k = 0                 # the usual path falls through (a taken branch costs)
    while k < len(ops):
        lines, taken = _one_word_lookup(label, ops[k:k + 3], frame, lowered, offsets, cold)
        if not taken:
            lines, taken = _fused(label, ops[k:k + 3])
        if not taken:
            lines, taken = _operation(label, ops[k], frame, lowered, offsets, cold), 1
        body += lines
        k += taken
    body = _without_jumps_to_next(_without_reloads(_without_stack_moves(
        body + [f"{label}_return:"])))
    saved = [r for r in _SAVED if r in _ALWAYS_SAVED or any(r in line for line in body + cold)]
    # rsp 16-aligned below the frame, after the return address and the pushes (a
    # larger frame rather than a push more: a store less)
    size = frame.size + 8 * (len(saved) % 2 == 0)
    return [f"{label}:"] + [f"push {r}" for r in saved] + [
        "mov rbx, rdi",
        f"mov r12, qword ptr [rbx + {P.CTX_MAPS}]",
        f"sub rsp, {size}",
        "mov rbp, rsp"] + body + [f"add rsp, {size}"] + \
        [f"pop {r}" for r in reversed(saved)], cold


def _one_word_lookup(fn: str, ops, frame: L.Frame, lowered: L.Lowered,
                     offsets: List[int], cold: List[str]) -> Tuple[List[str], int]:
    """A map keyed by one word, its key just made and looked up (`key_word 0`, then
    `entry` or `find`): the entry at the key's first slot (maps.first_slot), checked
    inline with the key in a register, so that the entry's address is a multiply and a
    shift from the key (a store to it waits on that address); the key stored for the
    lookup, and its call, where that entry is not the key's (out of line). A constant key
    (`const K` first: `@[probe]`, whose word is the probe's name's) has its slot worked
    out here: the entry's address is a constant from the maps'. (ops taken: 2 or 3, else
    0.)"""
    constant = ops[0][1] if ops and ops[0][0] == "const" else None
    if constant is not None:
        ops = ops[1:]
    if len(ops) < 2 or ops[0] != ("key_word", 0) or ops[1][0] not in ("entry", "find"):
        return [], 0
    index = ops[1][1]
    shape = lowered.maps[index]
    if shape.key_words != 1:
        return [], 0
    found, missed = _unique(fn), _unique(fn)
    table = offsets[index] + 8 * M.HEADER_WORDS
    cold += [f"{missed}:", f"mov qword ptr [rbp + {frame.key}], rcx"] + \
        _lookup_call(frame, index, ops[1][0] == "entry") + [f"jmp {found}"]
    if constant is None:
        key = ["pop rcx"]
        address = [f"mov rsi, {HASH_MULTIPLIER:#x}"] + \
            _first_slot(shape, "rcx", "rsi", "rax") + [f"lea rax, [r12 + rax + {table}]"]
    else:
        word = constant & (2**64 - 1)
        key = [f"mov rcx, {word:#x}"]
        address = [f"lea rax, [r12 + {_known_entry(shape, offsets[index], word)}]"]
    # claimed (its state odd: published, its key written before it and never changed
    # after; x86 keeps loads in order) and by this key: no hash to work out here
    return key + address + [
            "test byte ptr [rax], 1", f"jz {missed}",
            f"cmp rcx, qword ptr [rax + {8 * M.ENTRY_HEAD}]", f"jne {missed}",
            f"{found}:", "push rax"], 2 + (constant is not None)


def _known_entry(shape: M.MapShape, offset: int, key: Optional[int] = None) -> int:
    """From the maps, the entry a lookup finds first: at a one-word key's first slot
    (maps.first_slot), or a map without keys' one entry (the table's first)."""
    slot = 0 if key is None else M.first_slot([key], shape.capacity)
    return offset + 8 * (M.HEADER_WORDS + slot * shape.entry_words)


def _lookup_call(frame: L.Frame, index: int, create: bool) -> List[str]:
    """map_N's call: rdi = the key buffer, esi = whether to make a missing entry."""
    return [f"lea rdi, [rbp + {frame.key}]", f"mov esi, {int(create)}", f"call map_{index}"]


def _first_slot(shape: M.MapShape, key: str, multiplier: str, into: str) -> List[str]:
    """`into` = the byte offset of a one-word key's first slot in its table's entries
    (maps.first_slot); `multiplier` holds HASH_MULTIPLIER."""
    entry_bytes = 8 * shape.entry_words
    out = _first_slot_index(shape, key, multiplier, into)
    if shape.capacity == 1:
        return out
    if entry_bytes & (entry_bytes - 1) == 0:
        return out + [f"shl {into}, {entry_bytes.bit_length() - 1}"]
    return out + [f"imul {into}, {into}, {entry_bytes}"]


def _first_slot_index(shape: M.MapShape, key: str, multiplier: str, into: str) -> List[str]:
    """`into` = maps.first_slot of the one-word key `key` (a register or a memory
    operand); `multiplier` holds HASH_MULTIPLIER."""
    bits = shape.capacity.bit_length() - 1
    if not bits:
        return [f"xor {_low32(into)}, {_low32(into)}"]
    return [f"mov {into}, {key}", f"imul {into}, {multiplier}", f"shr {into}, {64 - bits}"]


def _low32(register: str) -> str:
    return register + "d" if register[1].isdigit() else "e" + register[1:]


def _without_jumps_to_next(lines: List[str]) -> List[str]:
    """Without a `jmp L` that only labels separate from L (a block's end just before
    the function's return)."""
    out: List[str] = []
    for k, line in enumerate(lines):
        if line.startswith("jmp "):
            target, j = line[4:] + ":", k + 1
            while j < len(lines) and lines[j].endswith(":") and lines[j] != target:
                j += 1
            if j < len(lines) and lines[j] == target:
                continue
        out.append(line)
    return out


def _fused(fn: str, ops) -> Tuple[List[str], int]:
    """The first operations as one where lower.fused says so, and how many it took:
    0 for none."""
    f = L.fused(ops)
    if f is None:
        return [], 0
    name, *args = f.operation
    operands = ["pop rax", f"mov rcx, {f.constant:#x}"] if f.constant is not None \
        else ["pop rcx", "pop rax"]
    if f.jump_if_false is not None:
        cc = condition(args[0], args[1])
        return operands + ["cmp rax, rcx", f"j{_NEGATED[cc]} {fn}_{f.jump_if_false}"], f.taken
    if name == "binary":
        by = _by_constant(*args, f.constant)
        if by is not None:
            return ["pop rax"] + by + ["push rax"], f.taken
        return operands + _binary(fn, *args) + ["push rax"], f.taken
    cc = condition(args[0], args[1])
    return operands + ["xor edx, edx", "cmp rax, rcx", f"set{cc} dl", "push rdx"], f.taken


def _by_constant(op: str, signed: bool, value: int):
    """rax = rax / value or rax % value, unsigned, without a divide: a shift or a mask
    for a power of two, else a multiply by the reciprocal (Granlund and Montgomery's
    round-up method: exact for every 64-bit dividend). None where a divide it is
    (signed, or by 0)."""
    d = value & (2**64 - 1)
    if signed or op not in ("div", "mod") or d == 0:
        return None
    if d & (d - 1) == 0:
        if op == "div":
            return [f"shr rax, {d.bit_length() - 1}"] if d > 1 else []
        return [f"mov rcx, {d - 1:#x}", "and rax, rcx"]
    shift = (d - 1).bit_length()
    multiplier = (2**64 * ((1 << shift) - d)) // d + 1
    out = ["mov rsi, rax", f"mov rcx, {multiplier:#x}", "mul rcx",  # rdx: the high half
           "mov rax, rsi", "sub rax, rdx", "shr rax, 1", "add rax, rdx"]
    out += [f"shr rax, {shift - 1}"] if shift > 1 else []
    if op == "mod":
        out += [f"mov rcx, {d:#x}", "imul rax, rcx", "sub rsi, rax", "mov rax, rsi"]
    return out


def _without_reloads(lines: List[str]) -> List[str]:
    """`mov qword ptr [X], R` then `mov S, qword ptr [X]`: the second as `mov S, R` (a
    load through the store less), or nothing where S is R."""
    out: List[str] = []
    for line in lines:
        if out and line.startswith("mov ") and out[-1].startswith("mov qword ptr ["):
            stored_to, _, register = out[-1][len("mov qword ptr "):].partition("], ")
            target, _, source = line[4:].partition(", ")
            if source == f"qword ptr {stored_to}]" and "[" not in register + target \
                    and register not in stored_to and target not in stored_to:
                if target != register:
                    out.append(f"mov {target}, {register}")
                continue
        out.append(line)
    return out


def _without_stack_moves(lines: List[str]) -> List[str]:
    """`push X` then `pop Y` as one move (none where X is Y; kept where both are
    memory, or either names rsp, whose value the pair changes in between)."""
    out: List[str] = []
    for line in lines:
        if out and line.startswith("pop ") and out[-1].startswith("push "):
            source, target = out[-1][5:], line[4:]
            if "rsp" not in source + target and not ("[" in source and "[" in target):
                out.pop()
                if source != target:
                    out.append(f"mov {target}, {source}")
                continue
        out.append(line)
    return out


def _operation(fn: str, op: tuple, frame: L.Frame, lowered: L.Lowered,
               offsets: List[int], cold: List[str]) -> List[str]:
    """`op`'s code; what its hits seldom run goes into `cold` (after the function)."""
    name, args = op[0], op[1:]
    if name == "const":
        return [f"mov rax, {args[0]:#x}", "push rax"]
    if name == "ctx":
        return [f"push qword ptr [rbx + {args[0]}]"]
    if name == "ctx_address":
        return [f"lea rax, [rbx + {args[0]}]", "push rax"]
    if name == "arg":
        n = args[0]
        return [f"push qword ptr [rbx + {P.CTX_ARGS + 8 * n}]"] if n < P.ARGUMENTS else ["push 0"]
    if name == "farg":  # (a read: no floating-point state changes)
        return [f"movq rax, xmm{args[0]}", "push rax"]
    if name == "float_int":
        return _float_integer(fn, args[0])
    if name == "fcompare":
        true, false, nan, end = (_unique(fn) for _ in range(4))
        return ["pop rax"] + float_test(*args, "rax", "rcx", true, false, nan) + [
            f"{true}:", "push 1", f"jmp {end}", f"{false}:", "push 0", f"{end}:"]
    if name == "local":
        return [f"push qword ptr [rbp + {frame.local(args[0])}]"]
    if name == "set_local":
        return [f"pop qword ptr [rbp + {frame.local(args[0])}]"]
    if name == "unary":
        if args[0] == "lnot":
            return ["pop rax", "xor ecx, ecx", "test rax, rax", "sete cl", "push rcx"]
        return [f"{args[0]} qword ptr [rsp]"]
    if name == "binary":
        return ["pop rcx", "pop rax"] + _binary(fn, *args) + ["push rax"]
    if name == "compare":
        cc = condition(args[0], args[1])
        return ["pop rcx", "pop rax", "xor edx, edx", "cmp rax, rcx", f"set{cc} dl", "push rdx"]
    if name == "cast":
        return ["pop rax"] + _extend(*args) + ["push rax"]
    if name == "read":
        size, signed = args
        read = _unique(fn)
        return ["pop rax", f"mov edx, {size}"] + _checked_read(fn, "[rsp + 32]") + \
            [f"cmp rax, {size}", f"je {read}", f"lock inc qword ptr [r12 + {M.FAULTS}]",
             f"{read}:", "mov rax, qword ptr [rsp + 32]", "add rsp, 48"] + \
            _extend(size, signed) + ["push rax"]
    if name == "string_at":
        return [f"lea rax, [rip + string_{args[0]}]", "push rax"]
    if name == "read_string":
        return _read_string(fn, frame.scratch + L.STRING * args[1], args[0])
    if name == "string_eq":
        return _string_equal(fn)
    if name == "jump":
        return [f"jmp {fn}_{args[0]}"]
    if name == "jump_zero":
        return ["pop rax", "test rax, rax", f"jz {fn}_{args[0]}"]
    if name == "label":
        return [f"{fn}_{args[0]}:"]
    if name == "drop":
        return ["add rsp, 8"]
    if name == "key_word":
        return [f"pop qword ptr [rbp + {frame.key + 8 * args[0]}]"]
    if name == "key_string":
        base = frame.key + 8 * args[0]
        out = ["pop rsi"]
        for i in range(M.STRING_WORDS):
            out += [f"mov rax, qword ptr [rsi + {8 * i}]", f"mov qword ptr [rbp + {base + 8 * i}], rax"]
        return out
    if name in ("entry", "find"):
        lookup = [f"lea rdi, [rbp + {frame.key}]", f"mov esi, {int(name == 'entry')}",
                  f"call map_{args[0]}"]
        if lowered.maps[args[0]].key_words:
            return lookup + ["push rax"]
        # a map without keys has one entry, at the table's start: claimed (its state
        # odd: the hash of no words, published), it is there without the call
        found, missed = _unique(fn), _unique(fn)
        cold += [f"{missed}:"] + _lookup_call(frame, args[0], name == "entry") + \
            [f"jmp {found}"]
        return [f"lea rax, [r12 + {_known_entry(lowered.maps[args[0]], offsets[args[0]])}]",
                "test byte ptr [rax], 1", f"jz {missed}", f"{found}:", "push rax"]
    if name == "update":
        return _update(fn, lowered.maps[args[0]], args[1])
    if name == "load":
        return _load(fn, lowered.maps[args[0]])
    if name == "load_string":
        return _load_string(fn, lowered.maps[args[0]], frame.scratch + L.STRING * args[1])
    if name == "delete":
        return _delete(fn, lowered.maps[args[0]])
    if name == "printf":
        return _printf(frame, *args)
    if name == "return":
        return [f"jmp {fn}_return"]
    raise ValueError(f"unknown operation {op}")


_UNIQUE = [0]


def _unique(fn: str) -> str:
    _UNIQUE[0] += 1
    return f"{fn}_u{_UNIQUE[0]}"


def _binary(fn: str, op: str, signed: bool) -> List[str]:
    """rax = rax OP rcx."""
    if op in ("add", "sub", "and", "or", "xor"):
        return [f"{op} rax, rcx"]
    if op == "mul":
        return ["imul rax, rcx"]
    if op == "shl":
        return ["shl rax, cl"]
    if op == "shr":
        return ["sar rax, cl" if signed else "shr rax, cl"]
    # div, mod: by zero, 0 and the dividend (eBPF's); INT64_MIN / -1 wraps, as no trap may
    done, divide = _unique(fn), _unique(fn)
    zero = ["xor eax, eax"] if op == "div" else []
    out = ["test rcx, rcx", f"jnz {divide}"] + zero + [f"jmp {done}", f"{divide}:"]
    if signed:
        minus_one = _unique(fn)
        out += ["cmp rcx, -1", f"jne {minus_one}",
                "neg rax" if op == "div" else "xor eax, eax", f"jmp {done}", f"{minus_one}:",
                "cqo", "idiv rcx"]
    else:
        out += ["xor edx, edx", "div rcx"]
    if op == "mod":
        out.append("mov rax, rdx")
    return out + [f"{done}:"]


def _extend(size: int, signed: bool, register: str = "rax") -> List[str]:
    """The low `size` bytes of `register` (rax, rbx, rcx or rdx) sign- or zero-extended."""
    if size == 8:
        return []
    low = "e" + register[1:]
    if size == 4:
        return [f"movsxd {register}, {low}" if signed else f"mov {low}, {low}"]
    part = {1: register[1] + "l", 2: register[1:]}[size]
    return [f"movsx {register}, {part}" if signed else f"movzx {low}, {part}"]


def condition(comparison: str, signed: bool) -> str:
    """The condition code of a comparison (lower's eq, lt, ...), and `negated`'s."""
    return (_SIGNED_CC if signed else _UNSIGNED_CC)[comparison]


def negated(cc: str) -> str:
    return _NEGATED[cc]


def _float_integer(fn: str, kind: str) -> List[str]:
    """The float's or double's word on the stack as an integer toward zero (NaN 0,
    saturating: floats.truncated), in integer instructions: the exponent, then the
    mantissa with its hidden bit shifted by it."""
    exponent_bits, mantissa_bits, bias = floats.layout(kind)
    top, mantissa = (1 << exponent_bits) - 1, (1 << mantissa_bits) - 1
    sign = (32 if kind == floats.F32 else 64) - 1
    zero, big, right, signed, saturate, done = (_unique(fn) for _ in range(6))
    return ["pop rax", "mov rdx, rax", f"shr rdx, {mantissa_bits}", f"and edx, {top}",
            f"cmp edx, {bias}", f"jb {zero}",  # |value| < 1
            f"cmp edx, {bias + 63}", f"jae {big}",
            f"movabs rsi, {mantissa:#x}", "and rsi, rax", f"bts rsi, {mantissa_bits}",
            f"lea ecx, [rdx - {bias + mantissa_bits}]",
            f"cmp edx, {bias + mantissa_bits}", f"jb {right}",
            "shl rsi, cl", f"jmp {signed}",
            f"{right}:", "neg ecx", "shr rsi, cl",
            f"{signed}:", f"bt rax, {sign}", "mov rax, rsi", f"jnc {done}", "neg rax",
            f"jmp {done}",
            f"{big}:", f"cmp edx, {top}", f"jne {saturate}",  # infinity or NaN?
            f"movabs rcx, {mantissa:#x}", "test rax, rcx", f"jnz {zero}",
            f"{saturate}:", f"shr rax, {sign}", f"movabs rcx, {floats.INT64_MAX:#x}",
            "add rax, rcx", f"jmp {done}",  # INT64_MAX, or INT64_MIN if negative
            f"{zero}:", "xor eax, eax", f"{done}:", "push rax"]


def float_test(kind: str, comparison: str, place: int, value: str, scratch: str,
               true: str, false: str, nan: str) -> List[str]:
    """On to `true` if the float's or double's word in `value` is not NaN and
    floats.ordered() of it compares so with `place` (lower's fcompare), else to
    `false` (to `true` for a NaN and ne); integer instructions only. `value` and
    `scratch` are clobbered, the flags too."""
    out = [f"shl {value}, 32"] if kind == floats.F32 else []  # (its sign on top)
    out += [f"mov {scratch}, {value}", f"sar {scratch}, 63", f"btr {value}, 63",
            f"xor {value}, {scratch}", f"sub {value}, {scratch}",  # the magnitude, signed
            f"movabs {scratch}, {floats.infinity_place(kind):#x}",
            f"cmp {value}, {scratch}", f"jg {nan}", f"neg {scratch}",
            f"cmp {value}, {scratch}", f"jl {nan}",
            f"movabs {scratch}, {floats.top_aligned(place, kind):#x}",
            f"cmp {value}, {scratch}", f"j{condition(comparison, True)} {true}",
            f"jmp {false}", f"{nan}:", f"jmp {true if comparison == 'ne' else false}"]
    return out


def _checked_read(fn: str, buffer: str) -> List[str]:
    """process_vm_readv(pid, local {buffer, rdx}, 1, remote {rax, rdx}, 1, 0) on a
    48-byte area the caller frees: [rsp + 32] is the buffer, 0 where unread.
    rax: the address, rdx: the length (at most 8 here). -> rax: bytes read, or < 0."""
    return ["sub rsp, 48", "mov qword ptr [rsp + 32], 0",
            f"lea rcx, {buffer}", "mov qword ptr [rsp], rcx", "mov qword ptr [rsp + 8], rdx",
            "mov qword ptr [rsp + 16], rax", "mov qword ptr [rsp + 24], rdx",
            f"mov rdi, qword ptr [rbx + {P.CTX_PID}]", "mov rsi, rsp", "mov edx, 1",
            "lea r10, [rsp + 16]", "mov r8d, 1", "xor r9d, r9d",
            f"mov eax, {SYS_PROCESS_VM_READV}", "syscall"]


def _read_string(fn: str, buffer: int, limit: int) -> List[str]:
    """str(address, limit): at most limit - 1 bytes and a NUL into the buffer, which
    is cleared first; a read that fails is tried again up to the end of its page (a
    string near the end of its mapping)."""
    done = _unique(fn)
    out = ["pop r13"]
    out += [f"mov qword ptr [rbp + {buffer + 8 * i}], 0" for i in range(M.STRING_WORDS)]
    for attempt in range(2):
        out += ["mov rax, r13", f"mov edx, {limit}"]
        if attempt:  # up to the page's end
            out += ["mov rcx, r13", "and ecx, 4095", "mov edx, 4096", "sub edx, ecx",
                    f"cmp edx, {limit}", f"jbe {done}_len", f"mov edx, {limit}", f"{done}_len:"]
        out += _checked_read(fn, f"[rbp + {buffer}]") + ["add rsp, 48", "test rax, rax",
                                                       f"jg {done}"]
    out.append(f"lock inc qword ptr [r12 + {M.FAULTS}]")  # nothing there to read
    # what the read took past the string's end is not the string's: keys and
    # comparisons take all 64 bytes
    scan, clear, end = _unique(fn), _unique(fn), _unique(fn)
    out += [f"{done}:", f"mov byte ptr [rbp + {buffer + limit - 1}], 0",
            f"lea rdi, [rbp + {buffer}]", f"lea rcx, [rbp + {buffer + L.STRING}]",
            f"{scan}:", "cmp byte ptr [rdi], 0", f"je {clear}", "inc rdi", f"jmp {scan}",
            f"{clear}:", "cmp rdi, rcx", f"jae {end}", "mov byte ptr [rdi], 0", "inc rdi",
            f"jmp {clear}", f"{end}:", f"lea rax, [rbp + {buffer}]", "push rax"]
    return out


def _string_equal(fn: str) -> List[str]:
    differ, done = _unique(fn), _unique(fn)
    out = ["pop rsi", "pop rdi"]
    for i in range(M.STRING_WORDS):
        out += [f"mov rax, qword ptr [rdi + {8 * i}]", f"cmp rax, qword ptr [rsi + {8 * i}]",
                f"jne {differ}"]
    return out + ["push 1", f"jmp {done}", f"{differ}:", "push 0", f"{done}:"]


def _printf(frame: L.Frame, index: int, kinds) -> List[str]:
    """The values, popped last first into the event buffer, then the runtime's routine."""
    at = []
    word = 0
    for kind in kinds:
        at.append(word)
        word += M.STRING_WORDS if kind == "s" else 1
    out = []
    for kind, first in reversed(list(zip(kinds, at))):
        base = frame.event + 8 * first
        if kind == "s":
            out.append("pop rsi")
            for i in range(M.STRING_WORDS):
                out += [f"mov rax, qword ptr [rsi + {8 * i}]",
                        f"mov qword ptr [rbp + {base + 8 * i}], rax"]
        else:
            out.append(f"pop qword ptr [rbp + {base}]")
    return out + [f"mov edi, {index}", f"lea rsi, [rbp + {frame.event}]", f"mov edx, {word}",
                  f"call qword ptr [rbx + {P.CTX_EVENT}]"]


_VALUE = 8 * M.ENTRY_HEAD  # the value words, past state and present


def _value_at(shape: M.MapShape) -> int:
    return _VALUE + 8 * shape.key_words


def _update(fn: str, shape: M.MapShape, kind: str) -> List[str]:
    skip = _unique(fn)
    value = _value_at(shape)
    out = [] if kind == "count" else ["pop rax"]
    out += ["pop rdi", "test rdi, rdi", f"jz {skip}"]
    if kind == "count":
        out.append(f"lock inc qword ptr [rdi + {value}]")
    elif kind == "sum":
        out.append(f"lock add qword ptr [rdi + {value}], rax")
    elif kind in ("avg", "stats"):
        out += [f"lock inc qword ptr [rdi + {value}]", f"lock add qword ptr [rdi + {value + 8}], rax"]
    elif kind in ("min", "max"):
        again, done = _unique(fn), _unique(fn)
        keep = "jge" if kind == "min" else "jle"  # the stored one stays
        out += ["mov rdx, rax", f"mov rax, qword ptr [rdi + {value}]", f"{again}:",
                "cmp rdx, rax", f"{keep} {done}",
                f"lock cmpxchg qword ptr [rdi + {value}], rdx", f"jnz {again}", f"{done}:"]
    elif kind == "hist":
        bucket = _unique(fn)
        out += ["xor ecx, ecx", "test rax, rax", f"js {bucket}", "mov ecx, 1", f"jz {bucket}",
                "bsr rcx, rax", "add ecx, 2", f"{bucket}:",
                f"lock inc qword ptr [rdi + rcx * 8 + {value}]"]
    elif kind == "lhist":
        low, high, step = shape.lhist
        last = (high - low) // step + 1
        bucket = _unique(fn)
        out += ["xor ecx, ecx", f"mov rdx, {low:#x}", "cmp rax, rdx", f"jl {bucket}",
                f"mov ecx, {last}", f"mov rdx, {high:#x}", "cmp rax, rdx", f"jge {bucket}",
                f"mov rdx, {low:#x}", "sub rax, rdx", f"mov ecx, {step}", "xor edx, edx",
                "div rcx", "lea rcx, [rax + 1]", f"{bucket}:",
                f"lock inc qword ptr [rdi + rcx * 8 + {value}]"]
    elif kind == "value" and shape.holds_strings:  # rax: the string's address
        for i in range(M.STRING_WORDS):
            out += [f"mov rcx, qword ptr [rax + {8 * i}]",
                    f"mov qword ptr [rdi + {value + 8 * i}], rcx"]
    elif kind == "value":
        out.append(f"mov qword ptr [rdi + {value}], rax")
    else:
        raise ValueError(f"unknown aggregation {kind}")
    return out + ["mov qword ptr [rdi + 8], 1", f"{skip}:"]


def _load(fn: str, shape: M.MapShape) -> List[str]:
    """An entry's value, 0 for none: an avg() map's mean, rounded toward zero."""
    done = _unique(fn)
    value = _value_at(shape)
    out = ["pop rdi", "xor eax, eax", "test rdi, rdi", f"jz {done}",
           "cmp qword ptr [rdi + 8], 1", f"jne {done}"]
    if shape.kind == "avg":
        out += [f"mov rcx, qword ptr [rdi + {value}]", "test rcx, rcx", f"jz {done}",
                f"mov rax, qword ptr [rdi + {value + 8}]", "cqo", "idiv rcx"]
    else:
        out.append(f"mov rax, qword ptr [rdi + {value}]")
    return out + [f"{done}:", "push rax"]


def _load_string(fn: str, shape: M.MapShape, buffer: int) -> List[str]:
    """A map of strings' value, copied into the scratch buffer at rbp + `buffer` ("" for
    none): its address."""
    empty, done = _unique(fn), _unique(fn)
    value = _value_at(shape)
    out = ["pop rdi", f"lea rsi, [rbp + {buffer}]", "test rdi, rdi", f"jz {empty}",
           "cmp qword ptr [rdi + 8], 1", f"jne {empty}"]
    for i in range(M.STRING_WORDS):
        out += [f"mov rax, qword ptr [rdi + {value + 8 * i}]",
                f"mov qword ptr [rsi + {8 * i}], rax"]
    out += [f"jmp {done}", f"{empty}:", "xor eax, eax"]
    out += [f"mov qword ptr [rsi + {8 * i}], rax" for i in range(M.STRING_WORDS)]
    return out + [f"{done}:", "push rsi"]


def _delete(fn: str, shape: M.MapShape) -> List[str]:
    skip = _unique(fn)
    value = _value_at(shape)
    out = ["pop rdi", "test rdi, rdi", f"jz {skip}", "mov qword ptr [rdi + 8], 0"]
    initial = shape.initial or 0
    out.append(f"mov rax, {initial:#x}")
    out += [f"mov qword ptr [rdi + {value + 8 * i}], {'rax' if i == 0 else 0}"
            for i in range(shape.value_words)]
    return out + [f"{skip}:"]


def _lookup(index: int, shape: M.MapShape, offset: int) -> List[str]:
    """map_N(rdi = key buffer, esi = 1 to make a missing entry) -> rax = the entry, or
    0 (missing, or the table is full: counted in its header). Clobbers rcx, rdx; keeps
    r8 to r11 (it works in r13 to r15, saved here), so that a direct entry need not
    save those for a program whose code does not otherwise touch them."""
    fn = f"map_{index}"
    words = shape.key_words
    table = offset + 8 * M.HEADER_WORDS  # (from r12, the maps)
    back = ["pop r15", "pop r14", "pop r13", "ret"]
    out = [f"{fn}:", "push r13", "push r14", "push r15"]
    # the hash of the key's words, odd: a claimed entry's state
    out += [f"mov rcx, {HASH_MULTIPLIER:#x}", "mov rdx, rcx"]
    for i in range(words):
        out += [f"xor rdx, qword ptr [rdi + {8 * i}]", "imul rdx, rcx"]
    out += ["mov rax, rdx", "shr rax, 29", "xor rdx, rax", "or rdx, 1"]  # (entry_state)
    if words == 1:  # the first slot (maps.first_slot)
        out += _first_slot_index(shape, "qword ptr [rdi]", "rcx", "r14")
    else:
        out += ["mov r14, rdx", f"and r14, {shape.capacity - 1}"]
    out += [f"mov r15d, {shape.capacity}"]  # slots left to look at
    entry_bytes = 8 * shape.entry_words
    out += [f"{fn}_slot:", f"imul r13, r14, {entry_bytes}", f"lea r13, [r12 + r13 + {table}]",
            f"{fn}_state:", "mov rax, qword ptr [r13]",
            "cmp rax, rdx", f"je {fn}_compare",
            "test rax, rax", f"jz {fn}_free",
            "cmp rax, 2", f"jne {fn}_next",
            "pause", f"jmp {fn}_state",  # being claimed: its key comes next
            f"{fn}_compare:"]
    for i in range(words):
        out += [f"mov rcx, qword ptr [rdi + {8 * i}]",
                f"cmp rcx, qword ptr [r13 + {8 * (M.ENTRY_HEAD + i)}]", f"jne {fn}_next"]
    out += ["mov rax, r13"] + back + [
            f"{fn}_free:", "test esi, esi", f"jz {fn}_missing",
            "mov ecx, 2", "lock cmpxchg qword ptr [r13], rcx", f"jnz {fn}_state"]
    for i in range(words):
        out += [f"mov rcx, qword ptr [rdi + {8 * i}]",
                f"mov qword ptr [r13 + {8 * (M.ENTRY_HEAD + i)}], rcx"]
    if shape.initial is not None:
        out += [f"mov rcx, {shape.initial:#x}",
                f"mov qword ptr [r13 + {8 * (M.ENTRY_HEAD + words)}], rcx"]
    out += ["mov qword ptr [r13], rdx", "mov rax, r13"] + back + [  # published: x86
            f"{fn}_next:", "inc r14", f"and r14, {shape.capacity - 1}", "dec r15d",  # keeps
            f"jnz {fn}_slot", "test esi, esi", f"jz {fn}_missing",  # store order
            f"lock inc qword ptr [r12 + {offset + M.TABLE_DROPPED}]",
            f"{fn}_missing:", "xor eax, eax"] + back
    return out
