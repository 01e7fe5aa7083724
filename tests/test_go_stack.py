"""A trampoline in Go code keeps within what a goroutine's stack holds below sp
(base.GO_STACK_BUDGET): every path of its code and of the runtime routines it
calls is walked (tests/stack_depth.py), for each kind of point, on x86_64 and
arm64. Nothing is compiled: the runtime is assembled and trampolines are made for
points of each kind, as a rewrite makes them."""

import os
import sys

import pytest

from urewrite.arch.aarch64 import runtime as arm64_runtime
from urewrite.arch.aarch64.backend import AArch64Backend
from urewrite.arch.base import GO_STACK_BUDGET, CountPoint, RuntimeRefs, RuntimeSpec, Window
from urewrite.arch.x86_64 import runtime as x86_runtime, trampoline as x86_trampoline
from urewrite.arch.x86_64.backend import X86_64Backend
from urewrite.trampolines.arguments import encode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stack_depth import Code  # noqa: E402

SITE, TRAMPOLINE, RUNTIME, STATE = 0x401000, 0x600000, 0x500000, 0x900000
# one displaced instruction that leaves the stack alone: mov eax, ecx | mov x0, x1
ARCHES = {"x86_64": (X86_64Backend, bytes.fromhex("89c8"), x86_runtime),
          "aarch64": (AArch64Backend, bytes.fromhex("e00301aa"), arm64_runtime)}


def _kinds(go_code: bool) -> dict:
    back = CountPoint(0, (2,), False, leaves=(0,), go_code=go_code)
    args = (encode(()),)
    return {
        "entry": CountPoint(SITE, (1,), False, args, go_code=go_code),
        "entry, Go called from Go": CountPoint(SITE, (1,), False, args, go_code=go_code,
                                               called_from_go=go_code),
        "entry, latency": CountPoint(SITE, (1,), False, args, enters=True, go_code=go_code),
        "return, latency": CountPoint(SITE, (2,), False, args, leaves=(0,), go_code=go_code),
        # (pairs kept by goroutine: Go code's ABIInternal functions)
        "entry, latency by goroutine": CountPoint(SITE, (1,), False, args, enters=True,
                                                  go_code=go_code, g_register=go_code),
        "return, latency by goroutine": CountPoint(SITE, (2,), False, args, leaves=(0,),
                                                   go_code=go_code, g_register=go_code),
        "inside, flags live": CountPoint(SITE, (1, 3), True, args * 2, go_code=go_code),
        "entry, redirected return": CountPoint(SITE, (1,), False, args, True, redirect=back,
                                               go_code=go_code),
    }


def _made(arch: str, point):
    """(code, runtime) of `point`'s trampoline, with the runtime it calls."""
    backend_class, displaced, _ = ARCHES[arch]
    backend = backend_class()
    spec = RuntimeSpec(RUNTIME, STATE, 0x200000, 0x480000, 4096, 1 << 20, 64, b"t", SITE,
                       None, go_program=True)
    rt = backend.runtime(spec)
    refs = RuntimeRefs(STATE, 0x1240, rt.slow_hit, rt.lazy_init, rt.trace_event, rt.lat_enter,
                       rt.lat_exit, shadow_push=rt.shadow_push, shadow_pop=rt.shadow_pop,
                       lazy_init_aside=rt.lazy_init_aside, trace_event_go=rt.trace_event_go)
    insn = backend.decode(displaced, SITE, detail=True)[0]
    code = backend.trampoline(TRAMPOLINE, Window(SITE, insn.size, (insn,)), [point], refs)
    return Code(arch, [(RUNTIME, rt.code), (TRAMPOLINE, code)]), rt


def _depth(arch: str, point, writes=None, without=()) -> int:
    code, rt = _made(arch, point)
    for name in without:  # (a routine left out: counted as using nothing)
        code.callees[getattr(rt, name)] = (0, 0)
    return code.depth(TRAMPOLINE, writes)[0]


@pytest.mark.parametrize("kind", list(_kinds(True)))
def test_x86_64_go_code_fits_the_budget_on_every_path(kind):
    depth = _depth("x86_64", _kinds(True)[kind])
    assert depth <= GO_STACK_BUDGET["x86_64"], (kind, depth)


@pytest.mark.parametrize("kind", list(_kinds(False)))
def test_x86_64_c_code_still_keeps_out_of_the_red_zone(kind):
    """The same points in C code: their first push lies below the 128-byte red zone
    (the walk's depth is then at least the red zone and the 4 saved registers)."""
    assert _depth("x86_64", _kinds(False)[kind]) >= x86_trampoline.RED_ZONE + 32


@pytest.mark.parametrize("kind", list(_kinds(True)))
def test_arm64_go_code_fits_the_budget_untraced(kind):
    """Every path but the trace path; and the trampoline never writes the word just
    below the site's sp, where Go's arm64 frames keep the caller's frame pointer."""
    writes = set()
    depth = _depth("aarch64", _kinds(True)[kind], writes,
                   without=("trace_event", "trace_event_go"))
    assert depth <= GO_STACK_BUDGET["aarch64"], (kind, depth)
    assert -8 not in writes


@pytest.mark.parametrize("kind", list(_kinds(True)))
def test_arm64_go_code_fits_the_budget_traced(kind):
    """trace_event saves every register (272 bytes and more): over arm64's budget. In
    Go code only Go runs, trace_event_go enters it only where g's stack has TRACE_ROOM
    bytes below sp; up to there every path fits the budget, and trace_event needs no
    more than that room. (The runtime's assembly drops the event: C may enter it with
    anything in x28.)"""
    code, rt = _made("aarch64", _kinds(True)[kind])
    code.stops.add(rt.trace_event)
    assert code.depth(TRAMPOLINE)[0] <= GO_STACK_BUDGET["aarch64"], kind
    assert code.depth(rt.trace_event)[0] <= arm64_runtime.TRACE_ROOM
    assert rt.trace_event_go != rt.trace_event


def test_arm64_c_code_traces_without_the_check():
    """C code calls trace_event itself: the walk from its trampoline reaches it."""
    code, rt = _made("aarch64", _kinds(False)["entry"])
    assert code.depth(TRAMPOLINE)[0] > arm64_runtime.TRACE_ROOM // 2


@pytest.mark.parametrize("arch", list(ARCHES))
def test_set_up_in_go_code_runs_on_its_own_stack(arch):
    """lazy_init, called from Go code, runs on the state page's stack: the caller's
    stack holds only the call; that stack holds all lazy_init needs."""
    code, rt = _made(arch, _kinds(True)["entry"])
    aside, _ = code.depth(rt.lazy_init_aside)
    assert aside <= 32
    module = ARCHES[arch][2]
    needs, _ = code.depth(rt.lazy_init)
    assert needs + 16 <= module.ASIDE_TOP - module.ASIDE_BOTTOM
    # and C code calls lazy_init itself (another thread setting up makes it wait)
    c_code, _ = _made(arch, _kinds(False)["entry"])
    assert c_code.depth(TRAMPOLINE)[0] >= needs


def test_arm64_probe_programs_run_in_c_code_only():
    """A Go program's runtime runs no probe program (NO_PROGRAMS: run_program returns
    at once), so its trace_event keeps within TRACE_ROOM; elsewhere run_program puts
    the program's context below trace_event's frame."""
    from urewrite.trampolines import program_file
    depths = {}
    for go in (True, False):
        spec = RuntimeSpec(RUNTIME, STATE, 0x200000, 0x480000, 4096, 1 << 20, 64, b"t", SITE,
                           None, go_program=go)
        rt = AArch64Backend().runtime(spec)
        depths[go] = Code("aarch64", [(RUNTIME, rt.code)]).depth(rt.trace_event)[0]
    assert depths[True] <= arm64_runtime.TRACE_ROOM
    assert depths[False] >= depths[True] + program_file.CTX_SIZE
