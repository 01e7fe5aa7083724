"""Whether an ELF file is a Go program: the one place that decides it."""

from __future__ import annotations

GO_SECTIONS = (".go.buildinfo", ".gopclntab")
NT_GO_BUILD_ID = 4  # the "Go" note the Go linker writes (.note.go.buildid)


def is_go_program(elf) -> bool:
    """Go's linker names these sections (kept by `-s -w`), and writes a "Go" build ID
    note; either is enough."""
    if any(elf.section_named(name) is not None for name in GO_SECTIONS):
        return True
    return any(owner == b"Go" and kind == NT_GO_BUILD_ID for owner, kind, _ in elf.notes())
