"""Which probes a program needs in a file: the `-p` and `-r` specs that rewrite the
file with them, so that `urewrite IN -e PROGRAM` rewrites in one step."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List

from urewrite.programs.parser import ProgramError
from urewrite.programs.syntax import Builtin, Call, Probe, Program, nodes


@dataclass
class Specs:
    entries: List[str] = field(default_factory=list)  # -p
    returns: List[str] = field(default_factory=list)  # -r
    elsewhere: List[str] = field(default_factory=list)  # probes of other files, as written


def names_file(probe: Probe, paths: List[str]) -> bool:
    """Whether `probe` is in one of `paths`: by the path it names, by its basename, or
    any file for '*' (a program names the file as the process maps it, which may be
    the rewritten copy)."""
    if probe.path == "*":
        return True
    for path in paths:
        if os.path.basename(probe.path) == os.path.basename(path):
            return True
        if os.path.exists(probe.path) and os.path.exists(path) and \
                os.path.samefile(probe.path, path):
            return True
    return False


def spec_of(probe: Probe) -> str:
    """The -p or -r spec that puts `probe` in a file."""
    if probe.kind == "usdt":
        return f"usdt:{probe.provider}:{probe.name}"
    if probe.address is not None:
        return hex(probe.address)
    return f"{probe.function}+{probe.offset:#x}" if probe.offset else probe.function


def rewrite_specs(program: Program, paths: List[str]) -> Specs:
    """The specs of the probes `program` names in the file known by `paths` (the input
    and the output of a rewrite); a ProgramError when it names none there."""
    specs = Specs()
    for block in program.blocks:
        for probe in block.probes:
            if probe.kind in ("BEGIN", "END"):
                continue
            if not names_file(probe, paths):
                specs.elsewhere.append(probe.text)
                continue
            target = specs.returns if probe.kind == "uretprobe" else specs.entries
            spec = spec_of(probe)
            if spec not in target:
                target.append(spec)
    if not specs.entries and not specs.returns:
        named = sorted({probe.path for block in program.blocks for probe in block.probes
                        if probe.path})
        raise ProgramError(f"the program names no probe in {os.path.basename(paths[0])} "
                           f"(it names {', '.join(named) or 'only BEGIN and END'})")
    return specs


def arguments_used(program: Program) -> int:
    """How many of its probes' first arguments a program reads (arg0 .. argN): what a
    rewrite records at its entry probes."""
    used = [int(node.name[3:]) + 1 for node in nodes(program.blocks)
            if isinstance(node, Builtin) and re.fullmatch(r"arg\d+", node.name)]
    return max(used, default=0)


def prints(program: Program) -> bool:
    """Whether a probe of the program (not BEGIN or END) calls printf(), exit(), print(),
    clear() or zero(): what it does goes to a tracer, as events."""
    blocks = [b for b in program.blocks if any(p.kind not in ("BEGIN", "END") for p in b.probes)]
    return any(isinstance(node, Call) and node.function in ("printf", "exit", "print", "clear",
                                                             "zero") for node in nodes(blocks))
