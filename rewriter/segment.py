"""Lays out the new code segment and produces every byte that goes into it.

    program header table (filled in by the writer)
    region template: header, probe table, names (copied into the region at set-up),
        then the USDT semaphores to enable: a count and their addresses
    runtime: start-up hooks, set-up, slow path (from the backend)
    one trampoline per site (from the backend)

Also returns the patch for each site: the jump that replaces its window.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from urewrite.arch.base import Backend, BuiltInCall, CountPoint, RuntimeRefs, RuntimeSpec
from urewrite.arch.runtime_asm import LINK_PROGRAM
from urewrite.errors import UrewriteError
from urewrite.rewriter import parallel
from urewrite.rewriter.debug_sections import Span
from urewrite.rewriter.layout import Placement, align_up
from urewrite.trampolines import arguments, live_note, program_file, region

CODE_ALIGN = 16
# trampolines whose hot parts lie together, then their cold parts (aligned for their
# argument descriptors): docs/benchmarks.md, "Hot and cold"
COLD_BLOCK = 64
COLD_ALIGN = 8  # where a cold part may start: Backend.trampoline_apart's "a multiple of 8"
PROGRAM_ALIGN = 4096  # where a program built into the probes starts (build)


@dataclass
class SegmentImage:
    code: bytes  # the whole code segment, program header room included (zeros)
    patches: List[Tuple[int, bytes]]  # (address, bytes) to write over original code
    exe_start: int
    dso_start: int
    template: Tuple[int, int]  # (address, size)
    text: Tuple[int, int]  # (address, size): runtime and trampolines
    probes: List[region.ProbeInfo] = field(default_factory=list)
    live: bytes = b""  # the .urewrite.live descriptor (trampolines/live_note.py)
    stubs: List[Tuple[int, bytes]] = field(default_factory=list)  # (address, code) of pun stubs
    histograms_left_out: int = 0  # functions probed at entry and return beyond MAX_HISTOGRAMS
    spans: List[Span] = field(default_factory=list)  # the trampolines (debug_sections)
    routines: List[Tuple[str, int, int]] = field(default_factory=list)  # the runtime's: name,
    # start, end


def size_bound(plans, fault_hook: bool = False) -> int:
    """More bytes than build() will need for `plans` (a generous estimate); with a
    fault hook, whose table has 16 bytes per moved instruction."""
    bound = 64 * 1024  # program headers, runtime, and slack
    if fault_hook:
        bound += 4096 + 16 * sum(len(p.window.insns) + len(p.patching.moved.insns
                                                          if p.patching.moved else ())
                                 for p in plans)
    for plan in plans:
        sites = len(plan.sites)
        bound += 512 + 64 * len(plan.window.insns) + 512 * len(plan.points) + 256 * sites
        bound += 40 * sites + 600  # the region template's share: probe entry, name, semaphores
        moved = plan.patching.moved  # (an evicted neighbour, a successor: its own trampoline)
        if moved:
            bound += 64 + 64 * len(moved.insns)
    return bound


PARALLEL_AT = 1000  # trampolines from which each half is made on a core of its own


def _trampolines(backend: Backend, plans, start: int, refs: RuntimeRefs, count_point,
                 detailed, progress=None) -> tuple:
    """(code, patches, stubs, spans) of the trampolines of `plans`, the code starting at
    `start` (aligned): each trampoline, and the one of a window its plan moves away, at
    the next CODE_ALIGN boundary; each one's span (debug_sections.Span: where it is, and
    where it moved each instruction). Where the backend makes trampolines in two parts
    (Backend.trampoline_apart), the parts a counting hit runs of COLD_BLOCK trampolines
    lie together, the rest of theirs after them: a short run touches fewer pages and
    cache lines. `detailed(plan)`: the plan with its instructions decoded in detail
    (done here, by each process for its share)."""
    code, patches, stubs, spans = bytearray(), [], [], []
    waiting = []  # (hot part's offset in code, its place(), window): cold parts to place

    def place_cold_parts():
        for offset, place, window in waiting:
            cold_at = start + align_up(len(code), COLD_ALIGN)
            code.extend(bytes(cold_at - start - len(code)))
            try:
                hot, cold = place(cold_at)
            except OverflowError:
                raise UrewriteError(f"the trampoline of the window at {window:#x} is out of "
                                    f"branch reach of its other part at {cold_at:#x}")
            code[offset:offset + len(hot)] = hot
            code.extend(cold)
            spans.append(Span(cold_at, start + len(code), window, ()))
        waiting.clear()

    for plan in map(detailed, plans):
        at = start + align_up(len(code), CODE_ALIGN)
        code += bytes(at - start - len(code))
        try:
            points = []
            for point in plan.points:
                # a redirected return probe is counted by its stub, not at the entry
                redirected = [s for s in point.sites if s.redirect]
                counted = [s for s in point.sites if not s.redirect]
                redirect = count_point(point.address, redirected, False) if redirected else None
                points.append(count_point(point.address, counted, point.flags_live, redirect,
                                          point.taken, point.stays_within))
            apart = backend.trampoline_apart(at, plan.window, points, refs)
            if apart is None:
                code += backend.trampoline(at, plan.window, points, refs)
            else:
                hot_size, place = apart
                waiting.append((at - start, place, plan.window.address))
                code += bytes(hot_size)  # (written when its cold part is placed)
            spans.append(Span(at, start + len(code), plan.window.address, tuple(
                backend.moved_instructions(at, plan.window, points, refs))))
            moved_to, patching = None, plan.patching
            moved = patching.moved
            if moved:  # an evicted neighbour or successor: a trampoline of its own, no probe
                moved_to = start + align_up(len(code), CODE_ALIGN)
                code += bytes(moved_to - start - len(code))
                code += backend.trampoline(moved_to, moved, (), refs)
                spans.append(Span(moved_to, start + len(code), moved.address, tuple(
                    backend.moved_instructions(moved_to, moved, (), refs))))
            patches += patching.patches(backend, plan.window, at, moved_to)
            stubs += patching.stubs(backend, at, moved_to)
        except OverflowError:
            raise UrewriteError(f"{plan.site.name}: the trampoline at {at:#x} is out of branch "
                                f"reach of {plan.window.address:#x}")
        if len(waiting) == COLD_BLOCK:
            place_cold_parts()
        if progress:
            progress(1)
    place_cold_parts()
    return code, patches, stubs, spans


def _expected_size(trampolines, plans, start: int) -> int:
    """Bytes the trampolines of `plans` are expected to take, a little more: those of
    one plan in 16 made (a trampoline's size does not depend on its address), scaled."""
    sample = plans[::16]
    made = sum(align_up(len(trampolines([plan], start)[0]), CODE_ALIGN) for plan in sample)
    return made * len(plans) // len(sample) * 105 // 100 + 4096


def build(backend: Backend, plans, placement: Placement, object_name: str, build_id: bytes,
          file_tag: str, exe_entry: Optional[int], dso_init: Optional[int],
          arguments_of=lambda site: arguments.encode(()), progress=None,
          siteless=(), detailed=lambda plan: plan, go_program=False,
          go_functions=frozenset(), g_register=lambda site: False,
          called_from_go=lambda site: False, fault_hook=None, in_go_code=None,
          built_in=None) -> SegmentImage:
    """`arguments_of(site)`: the encoded argument descriptors its events record.
    `detailed(plan)`: the plan with its windows' instructions decoded in detail
    (Planner.detailed), for the code that moves them.
    `siteless`: probes with nothing to patch (return probes of functions that never
    return), listed in the region so that they report their 0 hits.
    `built_in(probes, machine)`: a program file to build in (pipeline.rewrite,
    program_file.BuiltProgram), after the runtime, where the runtime's link table
    points (runtime_asm.LINK_PROGRAM); a trampoline may run a probe's direct entry's
    work itself (CountPoint.built_in).
    `go_functions`: entries of the Go functions (.gopclntab), whose trampolines keep
    within what a goroutine's stack holds. `g_register(site)`: whether Go's g register
    holds the goroutine in the site's function (its latency pairs are kept per goroutine).
    `called_from_go(site)`: whether only Go code runs the site's function
    (go_abi.called_only_from_go).
    `fault_hook`: the plan at the entry of Go's signal handler that carries the fault
    hook (rewriter/plan/go_faults.py), for the instructions `in_go_code(address)` says
    are Go's."""
    # one probe per key: every site of a USDT probe name counts into the same one
    index_of, probes, semaphores = {}, [], []
    all_sites = [site for p in plans for site in p.sites] + list(siteless)
    # a function probed at entry and at return gets a latency histogram
    keys = {site.probe_key for site in all_sites}
    # (as many as a probe's kind field can name: the others count without one)
    histogram_of, left_out = {}, set()
    for site in all_sites:
        if site.kind == region.KIND_RETURN and site.function.address in keys \
                and site.probe_key not in histogram_of:
            if len(histogram_of) < region.MAX_HISTOGRAMS:
                histogram_of[site.probe_key] = len(histogram_of)
            else:
                left_out.add(site.probe_key)
    measured = {key[1] for key in histogram_of}  # their entry probes' keys
    carried = {}  # the values a probe's events carry: the most of its sites' (a tail call's
    for site in all_sites:  # return value is not known there)
        count = arguments.count(arguments_of(site))
        carried[site.probe_key] = max(count, carried.get(site.probe_key, 0))
    for site in all_sites:
        if site.probe_key not in index_of:
            index_of[site.probe_key] = len(probes)
            probes.append(region.ProbeInfo(site.name, site.kind, site.probe_address,
                                           histogram_of.get(site.probe_key, -1),
                                           carried[site.probe_key]))
            if site.semaphore and site.semaphore not in semaphores:
                semaphores.append(site.semaphore)
    template, layout = region.build_template(probes, object_name, build_id, backend.elf_machine,
                                             go_program=go_program)
    # the runtime enables these USDT semaphores when it arms the probes; their
    # table follows the copied part, 8-aligned
    copied = len(template)
    template += bytes(-copied % 8) + struct.pack(f"<Q{len(semaphores)}Q", len(semaphores),
                                                 *semaphores)

    base = placement.code_vaddr
    template_at = base + align_up(placement.phdr_size, CODE_ALIGN)
    runtime_at = align_up(template_at + len(template), CODE_ALIGN)
    spec = RuntimeSpec(
        base=runtime_at, state=placement.state_vaddr, state_size=placement.state_size,
        template=template_at, template_size=copied,
        region_size=layout.region_size,
        slot_count=layout.slot_count, file_tag=file_tag.encode(), exe_entry=exe_entry,
        dso_init=dso_init, go_program=go_program, lowest=placement.lowest)
    try:
        runtime = backend.runtime(spec)
    except OverflowError:
        raise UrewriteError(f"the entry point ({exe_entry:#x}) or DT_INIT ({dso_init:#x}) is out "
                            f"of branch reach of the new code at {base:#x}"
                            if exe_entry is not None and dso_init is not None else
                            f"the entry point or DT_INIT is out of branch reach of the new code "
                            f"at {base:#x}")
    refs = RuntimeRefs(placement.state_vaddr, layout.owners_offset, runtime.slow_hit,
                       runtime.lazy_init, runtime.trace_event, runtime.lat_enter,
                       runtime.lat_exit, trace_event_go=runtime.trace_event_go,
                       shadow_push=runtime.shadow_push,
                       shadow_pop=runtime.shadow_pop, lazy_init_aside=runtime.lazy_init_aside)

    code = bytearray(template_at - base)
    code += template
    code += bytes(runtime_at - base - len(code))
    code += runtime.code
    ends = [address for _, address in runtime.routines[1:]] + [runtime_at + len(runtime.code)]
    routines = [(name, address, end) for (name, address), end in zip(runtime.routines, ends)]
    program = built_in(probes, backend.elf_machine) if built_in is not None else None
    built_in_calls = {}  # probe index -> BuiltInCall: what its trampoline may run itself
    if program:
        # before the trampolines, which may call into it; at a page boundary: its code
        # may address its data by pages (arm64's adrp in a C callback), and the program
        # file keeps its code page-aligned
        program_at = align_up(base + len(code), PROGRAM_ALIGN)
        code += bytes(program_at - base - len(code)) + program.blob
        struct.pack_into("<q", code, runtime_at - base + LINK_PROGRAM, program_at - runtime_at)
        routines.append(("built_in_program", program_at, program_at + len(program.blob)))
        # (its file: header, code, stubs)
        built_in_calls = {number: BuiltInCall(dataclasses.replace(entry, function=0),
                                              program_at + entry.function,
                                              program_at + program_file.RUN_AT,
                                              program_at + program.entry_at[number])
                          for number, entry in program.entries.items()}

    def count_point(address, sites, flags_live, redirect=None, taken=False, stays_within=()):
        per_probe = {index_of[site.probe_key]: site for site in sites}
        indexes = tuple(sorted(per_probe))
        enters = any(s.kind != region.KIND_RETURN and s.probe_key in measured for s in sites)
        leaves = tuple(sorted({histogram_of[s.probe_key] for s in sites
                               if s.probe_key in histogram_of}))
        go_code = all(s.function.address in go_functions for s in sites)
        g_held = go_code and (enters or leaves) and all(g_register(s) for s in sites)
        from_go = go_code and all(called_from_go(s) for s in sites)
        call = built_in_calls.get(indexes[0]) if len(indexes) == 1 else None
        return CountPoint(address, indexes, flags_live,
                          tuple(arguments_of(per_probe[i]) for i in indexes),
                          enters, leaves, redirect, taken, stays_within, go_code, g_held,
                          from_go, call)

    def trampolines(part, start: int, step=None) -> tuple:
        return _trampolines(backend, part, start, refs, count_point, detailed, step)

    first_at = base + align_up(len(code), CODE_ALIGN)
    half = len(plans) // 2
    if half < PARALLEL_AT:
        chunk, patches, stubs, spans = trampolines(plans, first_at, progress)
    else:
        # The second half goes after the room the first half is expected to take,
        # and is made meanwhile on another core; where the first half takes more, it
        # is made again after it. The same on one core: the result does not depend on
        # the cores.
        second_at = align_up(first_at + _expected_size(trampolines, plans[:half], first_at),
                             CODE_ALIGN)
        second = parallel.Forked(lambda: trampolines(plans[half:], second_at))
        chunk, patches, stubs, spans = trampolines(plans[:half], first_at, progress)
        rest, rest_at = second.result(), second_at
        if first_at + len(chunk) > second_at:
            rest_at = align_up(first_at + len(chunk), CODE_ALIGN)
            rest = trampolines(plans[half:], rest_at)
        if progress:
            progress(len(plans) - half)
        chunk += bytes(rest_at - first_at - len(chunk))
        chunk += rest[0]
        patches += rest[1]
        stubs += rest[2]
        spans += rest[3]
    code += bytes(first_at - base - len(code))
    code += chunk
    if fault_hook is not None:  # last: it lists where the others moved Go's instructions
        hook = detailed(fault_hook)
        hook_at = base + align_up(len(code), CODE_ALIGN)
        code += bytes(hook_at - base - len(code))
        moved = [(t, o) for span in spans if in_go_code(span.window) for t, o, _ in span.moved]
        code += backend.fault_hook(hook_at, hook.window, moved)
        patches.append((hook.window.address, backend.site_patch(hook.window, hook_at)))
    live = live_note.build(backend.elf_machine, runtime_at, placement.state_vaddr,
                           placement.state_size, template_at + align_up(copied, 8),
                           backend.live_state, file_tag) if backend.live_state else b""
    return SegmentImage(bytes(code), patches, runtime.exe_start, runtime.dso_start,
                        (template_at, len(template)), (runtime_at, base + len(code) - runtime_at),
                        probes, live, stubs, len(left_out), spans, routines)
