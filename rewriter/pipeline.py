"""The rewrite, stage by stage: ELF in -> functions -> sites -> plan -> code -> ELF out."""

from __future__ import annotations

import gc
import hashlib
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from urewrite.arch import backend_for
from urewrite.errors import UrewriteError
from urewrite.rewriter import debug_sections, elf_writer, go_abi, layout, parallel, usdt
from urewrite.rewriter.elf_file import DT_INIT, ElfFile
from urewrite.rewriter.functions import Function, discover
from urewrite.rewriter.go_runtime import go_functions, is_go_program
from urewrite.rewriter.usdt import UsdtSite
from urewrite.rewriter.plan.results import Plan, Refusal
from urewrite.rewriter.plan.tactics import TACTICS
from urewrite.rewriter.planner import Planner
from urewrite.rewriter.selectors import Site, select
from urewrite.rewriter.taken_addresses import TakenIndex
from urewrite.rewriter import segment
from urewrite.trampolines import arguments, region
from urewrite.trampolines.region import KIND_ENTRY, KIND_RETURN, KIND_USDT


PREPARE_AT = 2000  # sites from which a rewrite analyses every function up front


@dataclass
class Analysis:
    """A file read, with its functions and USDT sites."""
    elf: ElfFile
    functions: List[Function]
    usdt: List[UsdtSite]
    planner: Planner
    symbols: Optional[usdt.Symbols] = None  # what USDT operands name (when first needed)

    def sdt_arguments(self, text: str) -> list:
        """The backend's ArgSpecs of a USDT argument string (ValueError: unreadable)."""
        if self.symbols is None:
            self.symbols = usdt.Symbols(self.elf)
        return self.planner.backend.sdt_arguments(text, self.symbols)


@dataclass
class RewriteResult:
    output: str
    plans: List[Plan]
    refusals: List[Refusal]
    warnings: List[str]
    spans: list = field(default_factory=list)  # the trampolines (debug_sections.Span)


def analyse(path: str, tactics: Optional[tuple] = None) -> Analysis:
    elf = ElfFile.open(path)
    if not elf.sections:
        # the scans that keep windows safe (far branches, stored code addresses) and
        # function discovery read sections: without them a patch could not be checked
        raise UrewriteError(f"{path}: no section headers (stripped with --strip-sections "
                            f"or sstrip?): urewrite needs them to patch safely")
    _refuse_rewritten(elf)
    backend = backend_for(elf.machine)
    scans = TakenIndex(elf, backend)
    scans.scan_ahead()  # (on the other core, while the functions are found)
    functions = discover(elf)
    return Analysis(elf, functions, usdt.discover(elf),
                    Planner(elf, backend, functions, tactics or TACTICS, scans))


def _refuse_rewritten(elf: ElfFile) -> None:
    """A file urewrite wrote is refused: its patches are not ordinary code to patch
    again. Its probes are named so that the user can rewrite the original with all."""
    template = elf.section_named(".urewrite.rodata")
    if template is None:
        return
    names = region.template_probe_names(elf.data[template.offset:template.offset + template.size])
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise UrewriteError(f"{elf.path}: already rewritten by urewrite (probes: {shown or 'none'}); "
                        f"rewrite the original file with every probe at once")


# progress(label, total) -> a step function to call with the number of items done,
# or None: how the command line shows a bar for long steps
Progress = Optional[Callable[[str, int], Optional[Callable[[int], None]]]]


def _steps(progress: Progress, label: str, total: int) -> Optional[Callable[[int], None]]:
    return progress(label, total) if progress else None


@dataclass
class ReturnProbe:
    """What `list` reports of a function's return probe."""
    exits: int  # exit sites patched
    tactics: Dict[str, int]  # tactic -> exits patched so
    redirected: bool  # its return address is redirected at the entry instead
    refusal: Optional[str]  # why it cannot be probed at all
    redirected_because: Optional[str]  # why its exits are not patched, when redirected
    checked: int = 0  # exits at indirect jumps, counted only when they leave (checked each time)


@contextmanager
def no_cycle_collection():
    """The cyclic garbage collector paused while a file is worked on. A big file makes
    millions of long-lived objects (sweeps, branch targets, windows), and each full
    collection would look at all of them again for nothing: the work makes next to no
    reference cycles, and reference counting frees the rest. (gc.freeze() at
    each stage did not help: the objects a stage makes are what a collection visits.)
    It runs again on leaving, for a caller that goes on to other files (--summary)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def list_sites(path: str, tactics: Optional[tuple] = None, progress: Progress = None,
               returns_as: Callable[[Dict[int, ReturnProbe]], object] = lambda found: found):
    """Every function entry and USDT site, each with its plan or refusal (plans that
    are only reported: no code is generated from them), and every function's return
    probe, planned in a child process meanwhile (parallel.py): (analysis, outcomes,
    returns), where returns() waits for them (the caller may do its own work first)
    and gives returns_as(function address -> its return probe), worked out in the
    child too."""
    with no_cycle_collection():
        a = analyse(path, tactics)
        prepared = len(a.functions) >= PREPARE_AT  # (both halves then need every function's)
        if prepared:  # (the sweep on the other core while the sites are made)
            a.planner.model.sweep_ahead(a.functions)
        entries = [Site(fn, fn.address, KIND_ENTRY, fn.name, fn.name, exact=False)
                   for fn in a.functions]
        return_sites = _return_sites(a)
        if prepared:
            a.planner.prepare(a.functions, meanwhile=a.planner.model.read_unwind_tables,
                              progress=_steps(progress, "analysing functions", len(a.functions)))
            a.planner.precompute(return_sites,
                                 _steps(progress, "finding exits", len(return_sites)))
        a.planner.model.taken_index.wait()  # (the scans ahead: done before the fork)
        returns = parallel.Forked(lambda: returns_as(return_probes(a, return_sites)))
        usdt_sites = select(["usdt:*:*"], a.functions, a.planner.model.boundaries, a.usdt) \
            if a.usdt else []
        usdt_sites, refused = usdt_refusals(a, usdt_sites, per_site=True)
        outcomes = (a.planner.plan(entries, _steps(progress, "entries", len(entries)))
                    + a.planner.plan(usdt_sites) + refused)
        return a, outcomes, returns.result


def usdt_refusals(a: Analysis, sites: List[Site], per_site: bool
                  ) -> Tuple[List[Site], List[Refusal]]:
    """(the sites left, the refusals) once the USDT probes that cannot be probed as
    their notes say are taken out (usdt.refusals: an argument form that cannot be
    read, a semaphore outside the writable memory, a note cut short): every site of
    such a probe, since a probe counts all its sites or none. `per_site`: a refusal
    for each of its sites (list's rows), else one for the probe (a rewrite's one
    line)."""
    usdt_sites = [s for s in sites if s.kind == KIND_USDT]
    bad = usdt.refusals(usdt_sites, a.sdt_arguments, a.elf, a.usdt) if usdt_sites else []
    if not bad:
        return sites, []
    first: Dict[str, Tuple[Site, str]] = {}
    for site, why in bad:
        first.setdefault(site.name, (site, why))
    reasons = dict(bad)
    site_count = {name: sum(s.name == name for s in usdt_sites) for name in first}
    kept, refused = [], []
    for s in sites:
        if s.kind != KIND_USDT or s.name not in first:
            kept.append(s)
            continue
        at, why = first[s.name]
        if per_site:
            refused.append(Refusal(s, reasons.get(s) or f"its site at {at.address:#x} cannot be "
                                                     f"probed: {why}"))
        elif s is at:
            others = site_count[s.name] - 1
            refused.append(Refusal(s, why + (f" (at {s.address:#x}: its {others} other site"
                                             f"{'s' if others > 1 else ''} left out too)"
                                             if others else "")))
    return kept, refused


def return_probes(a: Analysis, sites: List[Site]) -> Dict[int, ReturnProbe]:
    """Function address -> its return probe (of `sites`, every function's), planned
    at once."""
    outcomes = a.planner.plan(sites)  # (first: the probes below are not made beside it)
    found = {fn.address: ReturnProbe(0, {}, False, None, None) for fn in a.functions}
    for o in outcomes:
        if not isinstance(o, Plan):
            found[o.site.function.address].refusal = o.reason
            continue
        tactic = o.tactic  # (one per plan: asked once)
        for point in o.points:
            for site in point.sites:
                probe = found[site.function.address]
                if site.redirect:
                    probe.redirected = True
                else:
                    probe.exits += 1
                    probe.checked += bool(site.stays_within)
                    probe.tactics[tactic] = probe.tactics.get(tactic, 0) + 1
    for address, reason in a.planner.redirected_because.items():
        found[address].redirected_because = reason
    return found


def _return_sites(a: Analysis) -> List[Site]:
    return [Site(fn, fn.address, KIND_RETURN, fn.name, fn.name, exact=False)
            for fn in a.functions]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _file_tag(output: str, elf: ElfFile, plans: List[Plan]) -> str:
    """Names this object's region files: readable, and the same for the same rewrite."""
    digest = hashlib.sha256(elf.data)
    for p in plans:
        digest.update(f"{p.site.address:x}:{p.site.kind};".encode())
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", os.path.basename(output))[:40]
    return f"{stem}-{digest.hexdigest()[:8]}"


def _dt_init(elf: ElfFile) -> Optional[tuple]:
    """(file offset of the DT_INIT entry, its value): the hook for shared objects."""
    return next(((at, value) for tag, value, at in elf.dynamic_entries() if tag == DT_INIT), None)


def rewrite(input_path: str, output_path: str, specs: List[str], keep_going: bool = False,
            entry_args: int = 0, return_specs: List[str] = (), progress: Progress = None,
            tactics: Optional[tuple] = None, exclude: List[str] = (),
            kept: Optional[list] = None, built_in=None) -> RewriteResult:
    """Write `output_path`: the input with probes at the sites `specs` and
    `return_specs` select. `kept`: a list to put the file's analysis in, for a caller
    that ends without freeing it (the command line: freeing a big file's takes a
    second). `built_in(probes, machine)`: the program file (trampolines/program_file.py)
    to build into the probes, given the output's probe table, or None."""
    if _same_file(input_path, output_path) if os.path.exists(output_path) else \
            os.path.realpath(input_path) == os.path.realpath(output_path):
        raise UrewriteError("the output must not be the input file")
    with no_cycle_collection():
        return _rewrite(input_path, output_path, specs, keep_going, entry_args, return_specs,
                        progress, tactics, exclude, kept, built_in)


def _rewrite(input_path: str, output_path: str, specs: List[str], keep_going: bool,
             entry_args: int, return_specs: List[str], progress: Progress,
             tactics: Optional[tuple], exclude: List[str],
             kept: Optional[list], built_in=None) -> RewriteResult:
    a = analyse(input_path, tactics)
    if kept is not None:
        kept.append(a)
    elf, backend = a.elf, a.planner.backend
    warnings: List[str] = []
    sites = select(specs, a.functions, a.planner.model.boundaries, a.usdt, return_specs,
                   notes=warnings, exclude=exclude)
    if exclude and not sites:
        raise UrewriteError("--exclude leaves no site to probe")
    sites, refused_usdt = usdt_refusals(a, sites, per_site=False)
    if len(sites) >= PREPARE_AT:  # most of the file: analyse every function on all cores,
        # and find the sites' windows the same way (list does the same)
        a.planner.prepare(a.functions, meanwhile=a.planner.model.read_unwind_tables,
                          progress=_steps(progress, "analysing functions", len(a.functions)))
        a.planner.precompute(sites, _steps(progress, "finding windows", len(sites)))
    outcomes = a.planner.plan(sites, _steps(progress, "planning", len(sites))) + refused_usdt
    plans = [o for o in outcomes if isinstance(o, Plan)]
    refusals = [o for o in outcomes if isinstance(o, Refusal)]
    exact = [r for r in refusals if r.site.exact]
    if exact and not keep_going:
        r = exact[0]
        more = f" (and {len(exact) - 1} more)" if len(exact) > 1 else ""
        raise UrewriteError(f"cannot probe {r.site.name}: {r.reason}{more}")
    if not plans and not a.planner.exits.siteless:
        why = f": {refusals[0].site.name}: {refusals[0].reason}" if refusals else ""
        raise UrewriteError(f"no patchable site{why}")

    exe_entry = elf.entry if elf.is_executable and elf.entry else None
    dt_init = _dt_init(elf)
    if exe_entry is None and dt_init is None:
        raise UrewriteError(f"{elf.path}: a shared object without DT_INIT (no place to start "
                            f"the probe runtime from) is not supported yet")
    arguments_of = _ArgumentEncoder(a, backend, entry_args)
    faults = a.planner.windows.go_faults  # (a Go program's fault hook, if any)

    def g_register(site: Site) -> bool:
        """Whether the g register (r14, x28) holds the goroutine at the entry and returns
        of the site's function: ABIInternal (ABI0 assembly may use r14 for anything)."""
        return arguments_of.convention(site).name == arguments.GO_REGISTERS

    def called_from_go(site: Site) -> bool:
        return go_abi.called_only_from_go(arguments_of.convention(site), site.function.name)

    def build(placement, progress=None):
        return segment.build(backend, plans, placement, os.path.basename(output_path),
                             elf.build_id, _file_tag(output_path, elf, plans), exe_entry,
                             dt_init[1] if dt_init else None, arguments_of=arguments_of,
                             progress=progress, siteless=a.planner.exits.siteless,
                             detailed=a.planner.windows.detailed, go_program=is_go_program(elf),
                             go_functions=go_functions(elf), g_register=g_register,
                             called_from_go=called_from_go,
                             fault_hook=faults.hook, in_go_code=faults.in_go_code,
                             built_in=built_in)

    # The state memory follows the code: place it after a bound on the code's size
    # (a gap there costs address space, no file bytes) and build once; should the
    # bound ever fall short, build again with the state right after the code.
    # Punned jumps' stubs lie above both, where the bytes their jumps end in say
    # (planner.stub_floor), each page run a segment of its own.
    stubs = [(stub, bytes(backend.patch_size)) for p in plans
             for stub in p.patching.stub_addresses()]
    segments = 2 + len(layout.stub_pages(stubs))
    stubs_from = a.planner.stub_floor if stubs else 0
    bound = segment.size_bound(plans, faults.hook is not None)
    if stubs_from:  # (a bound is only a bound: the code itself must fit below the stubs)
        bound = min(bound, layout.room_below(elf, stubs_from, backend.state_size))
    placement = layout.place(elf, bound, backend.state_size, segments, stubs_from)
    image = build(placement, progress=_steps(progress, "generating trampolines", len(plans)))
    if placement.code_vaddr + len(image.code) > placement.state_vaddr:
        placement = layout.place(elf, len(image.code), backend.state_size, segments, stubs_from)
        image = build(placement)
    warnings.extend(arguments_of.notes())
    if image.histograms_left_out:
        warnings.append(f"latency histograms for the first {region.MAX_HISTOGRAMS} functions "
                        f"probed at entry and return only (all a region can hold): "
                        f"{image.histograms_left_out} more count their hits without one")
    entry = image.exe_start if exe_entry is not None else None
    elf_writer.write_atomically(
        output_path, lambda out: elf_writer.render(
            elf, placement, image, entry, dt_init[0] if dt_init else None, out,
            debug=lambda text_section: debug_sections.build(
                elf, image.spans, image.routines, debug_sections.function_lookup(a.functions),
                text_section)),
        os.stat(input_path).st_mode)
    return RewriteResult(output_path, plans, refusals, warnings, image.spans)


class _ArgumentEncoder:
    """site -> encoded argument descriptors for its events (cached per site), read in
    its function's calling convention (a Go program's: go_abi.py). Functions whose
    arguments cannot be read are gathered by reason: `notes()`, a warning for each."""

    def __init__(self, a: Analysis, backend, entry_args: int):
        self.a, self.backend, self.entry_args = a, backend, entry_args
        self.cache = {}
        self.go_convention = go_abi.conventions(a.elf)
        self.unread: Dict[str, List[str]] = {}

    def convention(self, site: Site) -> arguments.Convention:
        return self.go_convention(site.function) if self.go_convention else \
            arguments.C_CONVENTION

    def __call__(self, site: Site) -> bytes:
        found = self.cache.get(site)  # (hashing a site hashes its function: once, not twice)
        if found is None:
            try:
                found = arguments.encode(self._specs(site))
            except ValueError as e:  # (USDT sites were checked: usdt_refusals)
                names = self.unread.setdefault(str(e), [])
                if site.name not in names:
                    names.append(site.name)
                found = arguments.encode([])
            self.cache[site] = found
        return found

    def _specs(self, site: Site) -> list:
        if site.kind == KIND_USDT:
            return self.a.sdt_arguments(site.arguments)
        if site.kind == KIND_RETURN:  # (unknown yet at a tail call's jump)
            return [] if site.tail_call else \
                self.backend.return_value(self.convention(site), returned=site.redirect)
        return self.backend.abi_arguments(self.entry_args, self.convention(site)) \
            if self.entry_args else []

    def notes(self) -> List[str]:
        out = []
        for why, names in self.unread.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3
                                            else "")
            out.append(f"{shown}: arguments not recorded: {why}")
        return out
