"""Assembles a backend's runtime source with Keystone: shared by every backend.

A runtime source starts with its link table (five quads: its own link-time
address, then the state memory and region template as offsets from it, the
template size and the region size), which is filled in after assembly, since
Keystone resolves only labels inside the source PC-relatively. For the same
reason the start-up hooks end in reserved tails (labels exe_tail, dso_tail)
that receive a jump to the original entry point and DT_INIT, encoded by the
backend (Keystone mis-encodes arm64 branches to absolute addresses). Fields in
braces are substituted first; entry points are read back through a table of
`.quad label` appended at the end.
"""

from __future__ import annotations

import re
import struct
import threading
from importlib import resources
from typing import Callable, List, Sequence, Tuple

from urewrite.arch.base import Runtime, RuntimeSpec
from urewrite.trampolines import program_file, region

EXPORTS = ("exe_start", "dso_start", "slow_hit", "lazy_init", "trace_event", "lat_enter",
           "lat_exit", "lazy_init_aside", "exe_tail", "dso_tail")


def common_fields(spec: RuntimeSpec) -> dict:
    return {
        "TAG_BYTES": ", ".join(str(b) for b in spec.file_tag + b"\0"),
        "ENV_VAR": region.ENV_VAR,
        "ENV_VAR_LEN": len(region.ENV_VAR) + 1,
        "OFF_PID": region.OFF_PID, "OFF_LOAD_BIAS": region.OFF_LOAD_BIAS,
        "OBJECT_LOWEST": hex(spec.lowest), "PROGRAM_TRIES": PROGRAM_TRIES,
        "OFF_OWNERS": region.OFF_OWNERS, "OFF_COUNTERS": region.OFF_COUNTERS,
        "OFF_SLOT_COUNT": region.OFF_SLOT_COUNT, "OFF_SLOT_STRIDE": region.OFF_SLOT_STRIDE,
        "OWNER_ENTRY_SIZE": region.OWNER_ENTRY_SIZE, "OWNER_TID": region.OWNER_TID,
        "OWNER_TID_AT": region.OWNER_TID_AT, "THREAD_NAMES": region.THREAD_NAMES,
        "TRACE_VAR": region.TRACE_ENV_VAR, "TRACE_VAR_LEN": len(region.TRACE_ENV_VAR) + 1,
        "LATENCY_VAR": region.LATENCY_ENV_VAR,
        "LATENCY_VAR_LEN": len(region.LATENCY_ENV_VAR) + 1,
        "OFF_FLAGS": region.OFF_FLAGS, "FLAG_LATENCY": region.FLAG_LATENCY,
        "OFF_REGION_SIZE": region.OFF_REGION_SIZE, "OFF_RING": region.OFF_RING,
        "OFF_RING_ENTRIES": region.OFF_RING_ENTRIES,
        "OFF_CLOCK_REF_TICKS": region.OFF_CLOCK_REF_TICKS,
        "OFF_CLOCK_REF_NS": region.OFF_CLOCK_REF_NS, "OFF_CLOCK_HZ": region.OFF_CLOCK_HZ,
        "OFF_CLOCK_KIND": region.OFF_CLOCK_KIND,
        "RING_MIN": region.RING_MIN, "RING_MAX": region.RING_MAX,
        "RING_HEAD": region.RING_HEAD, "RING_DROPPED": region.RING_DROPPED,
        "RING_RECORDS": region.RING_RECORDS,
        "RECORD_SHIFT": region.RECORD_SIZE.bit_length() - 1,
        "REC_SEQ": region.REC_SEQ, "REC_TICKS": region.REC_TICKS, "REC_PROBE": region.REC_PROBE,
        "REC_TID": region.REC_TID, "REC_NARGS": region.REC_NARGS, "REC_ARGS": region.REC_ARGS,
        "OFF_PROBE_COUNT": region.OFF_PROBE_COUNT, "OFF_LATENCY_COUNT": region.OFF_LATENCY_COUNT,
        "OFF_NS_MULT": region.OFF_NS_MULT, "LATENCY_DEPTH": region.LATENCY_DEPTH,
        "LATENCY_BUCKETS_MAX": region.LATENCY_BUCKETS - 1,
        "HISTOGRAM_SHIFT": (8 * region.LATENCY_BUCKETS).bit_length() - 1,
        "HASH_MULTIPLIER": f"{region.HASH_MULTIPLIER:#x}", "SLOT_SHIFT": region.SLOT_SHIFT,
        "SLOT_MASK": region.SLOT_MASK,
        "OWNER_PROBES": region.OWNER_PROBES,
        "OFF_GO_CALLS": region.OFF_GO_CALLS, "GO_CALL_PROBES": region.GO_CALL_PROBES,
        "GO_CALL_SIZE": region.GO_CALL_SIZE,
        "GO_CALL_SIZE_SHIFT": region.GO_CALL_SIZE.bit_length() - 1,
        "GO_CALL_SHIFT": 64 - (region.GO_CALLS.bit_length() - 1),
        "GO_CALLS_MASK": hex(region.GO_CALLS * region.GO_CALL_SIZE - 1),
        **program_fields(spec),
    }


def program_fields(spec: RuntimeSpec) -> dict:
    """A probe program's files and context (trampolines/program_file.py), as both
    runtimes map and fill them."""
    return {
        "PROGRAM_MAGIC": hex(program_file.MAGIC), "MAPS_MAGIC": hex(program_file.MAPS_MAGIC),
        "PROGRAM_SUFFIX": program_file.PROGRAM_SUFFIX,
        "OWN_MAPS_PREFIX": program_file.OWN_MAPS_PREFIX,
        "CTX_SIZE": program_file.CTX_SIZE, "CTX_ARGUMENTS": program_file.ARGUMENTS,
        "CTX_ARGS": program_file.CTX_ARGS, "CTX_PID": program_file.CTX_PID,
        "CTX_TID": program_file.CTX_TID, "CTX_NSECS": program_file.CTX_NSECS,
        "CTX_MAPS": program_file.CTX_MAPS, "CTX_COMM": program_file.CTX_COMM,
        "CTX_EVENT": program_file.CTX_EVENT, "PRINTF_PROBE": hex(program_file.PRINTF_PROBE),
        "PRINTF_PROBE_HIGH": hex(program_file.PRINTF_PROBE >> 16),
        "USES_TID": program_file.USES_TID, "USES_NSECS": program_file.USES_NSECS,
        "USES_COMM": program_file.USES_COMM,
        "USES_TID_BIT": program_file.USES_TID.bit_length() - 1,
        "USES_NSECS_BIT": program_file.USES_NSECS.bit_length() - 1,
        "USES_COMM_BIT": program_file.USES_COMM.bit_length() - 1,
        # a Go program runs no probe program: its code's stack frames would not fit
        # below a goroutine's stack pointer (docs/design.md, "Go's stacks")
        "NO_PROGRAMS": "    ret" if spec.go_program else "",
    }


ATTEMPTS = 4
# places below the object where program_setup looks for room for a program's code
PROGRAM_TRIES = 4
# the link table (each runtime's first label): its address at link time, then the
# state memory's, the template's (from it), the template's and the region's sizes,
# and a program built into the probes (from it; 0: none), which the rewrite writes
LINK_PROGRAM = 40
COMMENT = {"KS_ARCH_X86": "#", "KS_ARCH_ARM64": "//"}


def without_comments(text: str, marker: str) -> str:
    """The source with its comments cut off: Keystone does not take `#` after an x86
    statement for a comment (`.quad 0  # ...` is refused alone), so it never sees one."""
    lines = []
    for line in text.splitlines():
        if '"' not in line:
            at = line.find(marker)
        else:  # a marker inside a string is no comment
            quoted, at = False, -1
            for i, char in enumerate(line):
                if char == '"':
                    quoted = not quoted
                elif not quoted and line.startswith(marker, i):
                    at = i
                    break
        lines.append((line if at < 0 else line[:at]).rstrip())
    return "\n".join(lines) + "\n"


def _on_a_fresh_stack(work):
    """work() run on a new thread: a stack of fresh, zeroed pages."""
    box = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as e:  # noqa: B902 (handed back to the caller)
            box["error"] = e
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def assemble_twice(text: str, base: int, ks_arch: str, ks_mode: str, filename: str) -> bytes:
    """Keystone's bytes for `text`, once two runs agree.

    Keystone's lexer reads stack memory it never wrote (valgrind: AsmLexer::LexDigit),
    so its answer for one text depended on what the process had left on its stack:
    in a CI run, `.quad 0` was "out of range" four times in a row. Each run gets a
    new thread, whose stack is fresh pages, and a runtime is kept only when two runs
    give the same bytes."""
    import keystone
    from urewrite.errors import UrewriteError
    previous, problem = None, None
    for _ in range(ATTEMPTS):
        try:
            encoding = _on_a_fresh_stack(lambda: keystone.Ks(
                getattr(keystone, ks_arch), getattr(keystone, ks_mode)).asm(text, base)[0])
        except keystone.KsError as e:
            problem = f"Keystone: {e}"
            continue
        if not encoding:  # Keystone's answer for a source that gave no code
            raise AssertionError(f"{filename}: Keystone assembled no code")
        if bytes(encoding) == previous:
            return previous
        previous, problem = bytes(encoding), "Keystone gave different bytes for the same text"
    raise UrewriteError(f"cannot assemble the runtime ({filename}): {problem}")


def assemble_with_starts(text: str, labels: Sequence[str], base: int, ks_arch: str,
                         ks_mode: str, filename: str) -> Tuple[bytes, List[int]]:
    """Keystone's bytes for `text` at `base` (assemble_twice), and the address of each
    of `labels` in them: a table of them is assembled after the text, then cut off."""
    code = assemble_twice(text + "".join(f".quad {label}\n" for label in labels), base,
                          ks_arch, ks_mode, filename)
    table = code[len(code) - 8 * len(labels):]
    return code[:len(code) - 8 * len(labels)], \
        [int.from_bytes(table[8 * k:8 * k + 8], "little") for k in range(len(labels))]


def assemble(package: str, filename: str, ks_arch: str, ks_mode: str, spec: RuntimeSpec,
             fields: dict, encode_jump: Callable[[int, int], bytes]) -> Runtime:
    """ks_arch, ks_mode: names of Keystone constants ("KS_ARCH_X86"): Keystone is
    imported only here, so commands that assemble nothing never load it."""
    source = resources.files(package).joinpath(filename).read_text()
    exports = "exports:\n" + "".join(f"    .quad {name}\n" for name in EXPORTS)
    text = without_comments(source.format(**common_fields(spec), **fields), COMMENT[ks_arch]) \
        + exports

    names = list(dict.fromkeys(routine_names(source, COMMENT[ks_arch]) +
                               [name for name in EXPORTS if not name.endswith("_tail")]))
    text += "routines:\n" + "".join(f"    .quad {name}\n" for name in names)
    code = bytearray(assemble_twice(text, spec.base, ks_arch, ks_mode, filename))
    # the routines' table: read, then cut off (only the output's symbols name them)
    routines = sorted(zip(struct.unpack_from(f"<{len(names)}Q", code, len(code) - 8 * len(names)),
                          names))
    del code[len(code) - 8 * len(names):]
    entry = dict(zip(EXPORTS, struct.unpack_from(f"<{len(EXPORTS)}Q", code,
                                                  len(code) - 8 * len(EXPORTS))))
    # Keystone drops some directives without a word (.inst on arm64): two labels
    # at one address would make a tail patch overwrite an entry point.
    if len(set(entry.values())) != len(EXPORTS):
        raise AssertionError(f"{filename}: runtime entry points overlap: {entry}")
    for tail, target in (("exe_tail", spec.exe_entry), ("dso_tail", spec.dso_init)):
        if target is not None:  # an object without one never runs that hook
            jump = encode_jump(entry[tail], target)
            at = entry[tail] - spec.base
            code[at:at + len(jump)] = jump
    link = spec.base  # link_table is the first label (LINK_PROGRAM: its sixth word)
    struct.pack_into("<5q", code, 0, link, spec.state - link, spec.template - link,
                     spec.template_size, spec.region_size)
    return Runtime(bytes(code), entry["exe_start"], entry["dso_start"], entry["slow_hit"],
                   entry["lazy_init"], entry["trace_event"], entry["lat_enter"],
                   entry["lat_exit"], entry["lazy_init_aside"],
                   routines=tuple((name, address) for address, name in routines))


def routine_names(source: str, comment: str) -> list:
    """The routines of a runtime source, for the output's symbols: each label at the
    start of a line, after a comment that starts a line, followed by an instruction
    (not data)."""
    names, lines = [], source.split("\n")
    for k, line in enumerate(lines):
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*):\s*$", line)
        if not match:
            continue
        before = next((l for l in reversed(lines[:k]) if l.strip()), "")
        after = next((l.strip() for l in lines[k + 1:] if l.strip()), "")
        if before.startswith(comment) and not after.startswith(".") \
                and not re.match(r"\w+:", after):
            names.append(match.group(1))
    return names
