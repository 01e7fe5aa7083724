"""Which calling convention each function of a Go program uses, for --args and return
values.

Go 1.17 (x86_64) and 1.18 (arm64) on compile every Go function to ABIInternal:
integer arguments and results in registers. Assembly functions use ABI0: all on
the stack. The ABI wrappers the compiler makes between the two use the ABI they
are called by. How a function's is told, from the most to the least direct:
- a name ending in `.abi0`: the linker's symbol-table name of an ABI0 function
  whose name also has an ABIInternal function (its wrapper), and the name
  gopclntab.py gives the ABI0 one of two functions its table names alike;
- .gopclntab's funcFlag ASM (Go 1.18 on): a function written in assembly. Only
  the packages Go's assembler lets choose an ABI (`TEXT ·f<ABIInternal>`: the
  runtime's, reflect, syscall, internal/bytealg, internal/chacha8rand) may write
  an ABIInternal one; anywhere else assembly is ABI0;
- no ASM flag: compiled from Go, ABIInternal.
Assembly in those packages without an `.abi0` name, and every function of a Go
1.16/1.17 table (which does not say whether registers were used), are UNKNOWN:
their arguments are not recorded, and the reason is given. C functions of a cgo
program are not in the table: they use the C ABI.
"""

from __future__ import annotations

from typing import Callable, Optional

from urewrite.rewriter import gopclntab
from urewrite.rewriter.elf_file import ElfFile
from urewrite.rewriter.functions import Function
from urewrite.rewriter.go_runtime import is_go_program
from urewrite.trampolines.arguments import (C_CONVENTION, GO_REGISTERS, GO_STACK, UNKNOWN,
                                            Convention)

# packages whose assembly may be ABIInternal (cmd/internal/objabi/pkgspecial.go)
ABI_CHOOSING_PACKAGES = ("runtime", "reflect", "syscall", "internal/bytealg",
                         "internal/chacha8rand")
ABI_CHOOSING_TREES = ("runtime/internal/", "internal/runtime/")
WORD = 8


def conventions(elf: ElfFile) -> Optional[Callable[[Function], Convention]]:
    """function -> its Convention, for a Go program; None for any other file (all C)."""
    table = gopclntab.table(elf) if is_go_program(elf) else None
    if table is None:
        return None
    return lambda fn: convention(table, fn)


def convention(table: gopclntab.GoTable, fn: Function) -> Convention:
    k = table.index_at(fn.address)
    if k is None:
        return C_CONVENTION  # (cgo's C functions, and any other code of the C toolchain)
    if table.magic == gopclntab.MAGIC_116:
        return Convention(UNKNOWN, why="a Go 1.16/1.17 table does not tell whether a "
                                       "function takes its arguments in registers")
    names = fn.names + (table.names[k],)
    asm = bool(table.flags[k] & gopclntab.FUNC_FLAG_ASM)
    if any(n.endswith(".abi0") for n in names) or \
            (asm and not _may_choose_abi(package_of(table.names[k]))):
        frame = int(table.frame_sizes[k])
        if frame < 0 or frame % WORD:
            return Convention(UNKNOWN, why="an ABI0 function whose argument frame size "
                                           "the table does not record")
        return Convention(GO_STACK, frame_words=frame // WORD)
    if asm:
        return Convention(UNKNOWN, why=f"assembly of package {package_of(table.names[k])} "
                                       f"may be ABI0 or ABIInternal, and no `.abi0` name "
                                       f"says which")
    return Convention(GO_REGISTERS)


# packages whose assembly C code enters (signal handlers, cgo's callbacks, thread
# starts), with whatever the C code left in Go's registers
C_ENTERED_PACKAGES = ("runtime", "runtime/cgo")


def called_only_from_go(convention: Convention, name: str) -> bool:
    """Whether only Go code runs the function `name` (of that convention): compiled Go
    (ABIInternal), or assembly (ABI0) of a package C never enters."""
    if convention.name == GO_REGISTERS:
        return True
    package = package_of(name)
    return convention.name == GO_STACK and package not in C_ENTERED_PACKAGES and \
        not package.startswith(ABI_CHOOSING_TREES)


def package_of(name: str) -> str:
    """A Go function's package path: 'internal/bytealg.Compare' -> 'internal/bytealg',
    'main.(*T).m' -> 'main'."""
    name = name.split("[", 1)[0]  # (a generic's type arguments name packages too)
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    return name[:dot] if dot > 0 else name


def _may_choose_abi(package: str) -> bool:
    return package in ABI_CHOOSING_PACKAGES or package.startswith(ABI_CHOOSING_TREES)
