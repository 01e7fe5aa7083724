"""x86_64 argument specs: sdt.h operands (AT&T syntax) and the SysV integer arguments.

Frame slots are where the trampoline saved each register (see trampoline.py):
r15 at slot 0 ... r8 at 7, then rdi, rbp, rbx, rsi, rdx, rax, rcx; 15 is the
stack pointer at the site.

The operands sdt.h's "nor" constraint gives, as GCC (and Clang) print them, all read:
- a constant: `$5`, `$-1`, `$0x10` (cut to the argument's size: `1@$-56` is 200);
- a register of any width: `%rax %eax %ax %al %ah`, `%r8 %r8d %r8w %r8b`, `%sil`
  ...; the size before the @ governs, within the register's width;
- memory: `DISP(BASE,INDEX,SCALE)`, any part left out (`-20(%rbp)`, `(%rax,%rdx,8)`,
  `16(,%rcx,8)`), DISP a number or a symbol plus or minus numbers;
- RIP-relative: `sym(%rip)`, `sym+8(%rip)`, `sym-8(%rip)`, `40+sym(%rip)` (the
  symbol's link-time address: the load bias is added at run time);
- absolute: `sym`, `sym+8`, `sym(,%rax,8)` (non-PIE code);
- a segment: `%fs:` (the thread pointer: thread-local variables, `%fs:sym@tpoff`,
  `%fs:16+sym@tpoff(,%rcx,8)` in an executable, `%fs:(%rax)` once the offset is in a
  register, `%fs:0x28`); `%cs: %ds: %es: %ss:` add nothing in 64-bit mode.
Refused with the reason, never guessed: floating-point values (`8f@...`, `%xmm0`),
`%gs:` (its base is not at hand in the trampoline), relocations other than
`@tpoff` (`@GOTPCREL`, `@gottpoff` ...), a symbol the symbol tables do not name
once (a static variable of several files), an address constant (`$sym`), 32-bit
addresses (`(%eax)`), a RIP-relative number without a symbol.
"""

from __future__ import annotations

import re
from typing import List

from urewrite.trampolines.arguments import (C_CONVENTION, GO_REGISTERS, GO_STACK,
                                            LINKED_MEMORY, MAX_ARGUMENTS, MEMORY, REGISTER,
                                            THREAD_MEMORY, UNKNOWN, ArgSpec, Convention, as_i64,
                                            constant, fits_i64, parse_number, quote, split_sdt)

SLOT = {"r15": 0, "r14": 1, "r13": 2, "r12": 3, "r11": 4, "r10": 5, "r9": 6, "r8": 7,
        "rdi": 8, "rbp": 9, "rbx": 10, "rsi": 11, "rdx": 12, "rax": 13, "rcx": 14, "rsp": 15}
NO_SLOT = 16
# Pushed by the trace path after rcx, rax, rdx, rsi; the last one lands at slot 0.
TRACE_PUSHES = (3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15)  # rbx rbp rdi r8 ... r15

_ABI = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
_GO_ABI = ("rax", "rbx", "rcx", "rdi", "rsi", "r8", "r9", "r10", "r11")  # ABIInternal
_LEGACY = ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp")
_NO_BASE_SEGMENTS = ("cs", "ds", "es", "ss")  # base 0 in 64-bit mode
_SYMBOL = r"[A-Za-z_.$][\w.$]*"
_TERM = re.compile(rf"\s*([-+]?)\s*(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+|{_SYMBOL})(@\w+)?\s*")
_MEMORY = re.compile(r"^(?P<disp>[^()]*)\((?P<inside>[^()]*)\)$")


def _registers() -> dict:
    """name -> (frame slot, width in bytes, right shift) of every general register."""
    out = {}
    for r in _LEGACY:
        full = "r" + r
        out[full], out["e" + r], out[r] = (SLOT[full], 8, 0), (SLOT[full], 4, 0), \
            (SLOT[full], 2, 0)
        out[r[0] + "l" if r.endswith("x") else r + "l"] = (SLOT[full], 1, 0)
    for r in "abcd":
        out[r + "h"] = (SLOT[f"r{r}x"], 1, 8)
    for n in range(8, 16):
        slot = SLOT[f"r{n}"]
        out[f"r{n}"], out[f"r{n}d"], out[f"r{n}w"] = (slot, 8, 0), (slot, 4, 0), (slot, 2, 0)
        out[f"r{n}b"] = out[f"r{n}l"] = (slot, 1, 0)
    return out


REGISTERS = _registers()


def register_slot(name: str) -> int:
    """Frame slot of a register named in any width: %eax, %ax, %al, %ah, %r9d, %sil ..."""
    return _register(name)[0]


def _register(name: str):
    name = name.strip().lstrip("%").lower()
    if name in REGISTERS:
        return REGISTERS[name]
    if re.fullmatch(r"[xyz]mm\d+|st(\(\d\))?|mm\d", name):
        raise ValueError(f"%{name} is a floating-point or vector register")
    if name in ("rip", "eip"):
        raise ValueError(f"%{name} is the instruction pointer")
    raise ValueError(f"%{name} is not a general register")


def sdt_arguments(text: str, symbols) -> List[ArgSpec]:
    """ArgSpecs of an sdt.h argument string. `symbols` (rewriter/usdt.py's Symbols)
    gives a symbol's link-time address and a thread-local one's offset from the thread
    pointer; None where none is needed. Raises ValueError naming the argument that
    cannot be read and why."""
    specs = []
    for k, arg in enumerate(split_sdt(text), 1):
        try:
            if arg.floating:
                raise ValueError("a floating-point value (trace records integers)")
            specs.append(_operand(arg.size, arg.signed, arg.operand, symbols))
        except ValueError as e:
            raise ValueError(f"argument {k} {quote(arg.text)} cannot be read: {e}") from None
    return specs


def _operand(size: int, signed: bool, operand: str, symbols) -> ArgSpec:
    operand = operand.strip()
    if operand.startswith("$"):
        value = parse_number(operand[1:])
        if value is None:
            raise ValueError("an address or expression as a constant" if re.fullmatch(
                rf"\$[-+]?{_SYMBOL}([-+].*)?", operand) else f"constant {operand} is not a number")
        if not fits_i64(value):
            raise ValueError(f"constant {operand} does not fit in 64 bits")
        return constant(size, signed, value)
    segment = None
    m = re.match(r"%(\w+)\s*:", operand)
    if m:
        segment, operand = m.group(1).lower(), operand[m.end():].strip()
        if segment == "gs":
            raise ValueError("the %gs segment: its base is not at hand in the trampoline")
        if segment != "fs" and segment not in _NO_BASE_SEGMENTS:
            raise ValueError(f"%{segment} is not a segment register")
        if segment != "fs":
            segment = None
    elif operand.startswith("%"):
        slot, width, shift = _register(operand)
        # the size before the @ governs, within what the register named holds
        return ArgSpec(REGISTER, min(size, width), signed, base=slot, shift=shift)
    m = _MEMORY.match(operand)
    disp_text, inside = (m.group("disp"), m.group("inside")) if m else (operand, None)
    if not disp_text.strip() and inside is None:
        raise ValueError("an empty operand")
    number, symbol, relocation = _displacement(disp_text)
    base = index = NO_SLOT
    scale, rip = 1, False
    if inside is not None:
        parts = [p.strip() for p in inside.split(",")]
        if len(parts) > 3 or (len(parts) == 1 and not parts[0]):
            raise ValueError(f"memory operand ({inside}) is not (BASE,INDEX,SCALE)")
        if parts[0]:
            if parts[0].lower() == "%rip":
                rip = True
            else:
                base = _address_register(parts[0])
        if len(parts) > 1:
            if not parts[1]:
                raise ValueError(f"memory operand ({inside}) has no index")
            if rip:
                raise ValueError("RIP-relative with an index")
            index = _address_register(parts[1])
            if index == SLOT["rsp"]:
                raise ValueError("%rsp cannot be an index")
        if len(parts) > 2:
            scale = parse_number(parts[2]) if parts[2] else 1
            if scale not in (1, 2, 4, 8):
                raise ValueError(f"scale {parts[2]} is not 1, 2, 4 or 8")
    kind = THREAD_MEMORY if segment == "fs" else MEMORY
    if relocation is not None:
        if relocation != "tpoff":
            raise ValueError(f"relocation @{relocation} is not followed")
        if segment != "fs" or rip:
            raise ValueError("@tpoff outside the %fs segment")
        number += _need(symbols).thread_offset(symbol)
    elif symbol is not None:
        if segment == "fs":
            raise ValueError(f"symbol {symbol} in the %fs segment without @tpoff")
        number += _need(symbols).address(symbol)
        kind = LINKED_MEMORY
    elif rip:
        raise ValueError("RIP-relative without a symbol: relative to an unknown instruction")
    if not fits_i64(number):
        raise ValueError(f"displacement {number:#x} does not fit in 64 bits")
    return ArgSpec(kind, size, signed, base=base, index=index, scale=scale, value=as_i64(number))


def _displacement(text: str):
    """(number, symbol or None, relocation or None) of a displacement: numbers and
    at most one symbol (added, not subtracted), joined by + and -."""
    number, symbol, relocation = 0, None, None
    at, text = 0, text.strip()
    if len(text) > 400:
        raise ValueError("a displacement too long to be an assembler's")
    first = True
    while at < len(text):
        m = _TERM.match(text, at)
        if m is None or (not first and not m.group(1)):
            raise ValueError(f"displacement '{text}' is not understood")
        sign, term, reloc = m.groups()
        value = parse_number(term)
        if value is None and term[0].isdigit():
            raise ValueError(f"number {term[:24]}... is too long")
        if value is not None:
            if reloc:
                raise ValueError(f"displacement '{text}' is not understood")
            number += -value if sign == "-" else value
        else:
            if symbol is not None:
                raise ValueError(f"displacement '{text}' names two symbols")
            if sign == "-":
                raise ValueError(f"displacement '{text}' subtracts a symbol")
            symbol, relocation = term, reloc[1:].lower() if reloc else None
        at, first = m.end(), False
    return number, symbol, relocation


def _address_register(name: str) -> int:
    slot, width, shift = _register(name)
    if width != 8 or shift:
        raise ValueError(f"{name.strip()} as an address register: only 64-bit addresses "
                         f"are read")
    return slot


def _need(symbols):
    if symbols is None:
        raise ValueError("names a symbol, and no symbol table was given")
    return symbols


def abi_arguments(count: int, convention: Convention = C_CONVENTION) -> List[ArgSpec]:
    """The first `count` integer argument words at a function's entry: SysV's
    registers; Go's (ABIInternal); or Go's stack frame (ABI0), no more words than
    it holds. ValueError for a convention that is not known."""
    if convention.name == GO_STACK:
        return _frame_words(min(count, convention.frame_words), above_return_address=True)
    _known(convention)
    registers = _GO_ABI if convention.name == GO_REGISTERS else _ABI
    return [ArgSpec(REGISTER, 8, True, base=SLOT[r]) for r in registers[:count]]


def abi_return(convention: Convention = C_CONVENTION, returned: bool = False) -> List[ArgSpec]:
    """The return value: rax in SysV and ABIInternal (the first result word); in ABI0
    every word of the frame, arguments then results (which of them are results the
    table does not tell), read at an exit, or once `ret` has popped the return
    address (`returned`)."""
    if convention.name == GO_STACK:
        return _frame_words(min(convention.frame_words, MAX_ARGUMENTS),
                            above_return_address=not returned)
    _known(convention)
    return [ArgSpec(REGISTER, 8, True, base=SLOT["rax"])]


def _frame_words(count: int, above_return_address: bool) -> List[ArgSpec]:
    first = 8 if above_return_address else 0
    return [ArgSpec(MEMORY, 8, True, base=SLOT["rsp"], value=first + 8 * k) for k in range(count)]


def _known(convention: Convention) -> None:
    if convention.name == UNKNOWN:
        raise ValueError(convention.why)
