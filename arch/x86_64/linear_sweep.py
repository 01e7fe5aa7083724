"""x86_64 linear sweeps (Backend.sweep, Backend.sweep_all): iced-x86 decodes.

Two ways to the same arrays. The native module (native/, Rust: iced-x86's own crate
at the version of the Python package) sweeps many functions in one call, with no
object per instruction, on two threads. Without it (an install without a Rust
toolchain), a Python loop over iced-x86's instructions makes them, some twenty times
slower (docs/benchmarks.md). The Python loop (`python_sweep`) is the
reference; native/src/lib.rs (`sweep_functions`) mirrors it, and
tests/test_native_sweep.py holds the two to the same results. Where iced-x86 meets an instruction it cannot decode, both
leave the function to `undecodable(code, address)` (Capstone's sweep decides where
its code ends)."""

from __future__ import annotations

import bisect
from typing import Callable, Optional, Sequence, Tuple

import iced_x86
import numpy as np

from urewrite.arch.base import BRANCH, CALL, JUMP, OTHER, PLAIN, RETURN, Sweep, SweepBatch

try:
    from urewrite.arch.x86_64 import native_sweep
except ImportError:  # built without Rust: the Python loop does it
    native_sweep = None

# the planner's searches over the sweeps, in Rust too (rewriter/sweep_search.py)
sweep_search_engine = getattr(native_sweep, "SweepSearch", None)

ENDBR64 = b"\xf3\x0f\x1e\xfa"

# iced-x86's flow control -> Sweep kinds (refined in python_sweep)
_ICED_KINDS = {iced_x86.FlowControl.CALL: CALL,
               iced_x86.FlowControl.UNCONDITIONAL_BRANCH: JUMP,
               iced_x86.FlowControl.CONDITIONAL_BRANCH: BRANCH,
               iced_x86.FlowControl.RETURN: RETURN,
               iced_x86.FlowControl.INDIRECT_BRANCH: OTHER,
               iced_x86.FlowControl.INDIRECT_CALL: PLAIN,
               iced_x86.FlowControl.INTERRUPT: PLAIN,
               iced_x86.FlowControl.EXCEPTION: PLAIN,
               iced_x86.FlowControl.XBEGIN_XABORT_XEND: PLAIN}
_NEXT, _CONDITIONAL = iced_x86.FlowControl.NEXT, iced_x86.FlowControl.CONDITIONAL_BRANCH
# flows of instructions that neither branch nor call (Sweep.marked: not marked for that)
_UNMARKED = frozenset((iced_x86.FlowControl.RETURN, iced_x86.FlowControl.INTERRUPT,
                       iced_x86.FlowControl.EXCEPTION))
_INVALID = iced_x86.Code.INVALID
_NEAR_BRANCH = frozenset((iced_x86.OpKind.NEAR_BRANCH16, iced_x86.OpKind.NEAR_BRANCH32,
                          iced_x86.OpKind.NEAR_BRANCH64))
_COUNTED = frozenset((iced_x86.Mnemonic.LOOP, iced_x86.Mnemonic.LOOPE, iced_x86.Mnemonic.LOOPNE,
                      iced_x86.Mnemonic.JRCXZ, iced_x86.Mnemonic.JECXZ, iced_x86.Mnemonic.JCXZ))
_NEAR_RETURNS = frozenset((iced_x86.Code.RETNQ, iced_x86.Code.RETNQ_IMM16))
_XBEGIN = frozenset((iced_x86.Code.XBEGIN_REL16, iced_x86.Code.XBEGIN_REL32))

Undecodable = Callable[[bytes, int], Sweep]


def sweep(code: bytes, address: int, undecodable: Undecodable) -> Sweep:
    """The sweep of one function's code."""
    if native_sweep is None:
        return python_sweep(code, address, undecodable)
    # (one function: its arrays are the call's whole arrays; asked 10,000s of times
    # where only some functions are planned, so without the batch's bookkeeping)
    made = _native_arrays(code, np.array([[0, len(code), address]], dtype=np.int64))
    if made[5][0] < 0:
        return undecodable(code, address)
    return Sweep(*made[:5])


def sweep_all(data: bytes, spans: Sequence[Tuple[int, int, int]],
              undecodable: Undecodable) -> Optional[SweepBatch]:
    """The sweeps of many functions, (offset in `data`, size, address) each, made at
    once; None without the native module (the caller then sweeps them as it goes)."""
    if native_sweep is None:
        return None
    try:
        return native_sweeps(data, spans, undecodable)
    except BaseException as e:  # (a Rust panic is a BaseException: pyo3's PanicException)
        if type(e).__name__ != "PanicException":
            raise
        # never seen but once, under load, its message lost (it carries it now): the
        # Python sweep, which tests hold the native one to, does the work instead
        import sys
        print(f"urewrite: warning: the native sweep failed ({e}); sweeping in Python",
              file=sys.stderr)
        return None


def native_sweeps(data: bytes, spans: Sequence[Tuple[int, int, int]],
                  undecodable: Undecodable) -> SweepBatch:
    table = np.array(spans, dtype=np.int64).reshape(-1, 3)  # (offset, size, address) rows
    edges, rows, kinds, targets, marked, counts, made = _native_arrays(data, table)
    counts = counts.reshape(-1, 3)
    # where each lies in the arrays: its first edge, row and marked, and their numbers
    # (one the decoder could not sweep: -1 edges, in no array)
    where = np.zeros((len(table), 6), dtype=np.int64)
    where[:, 1::2] = counts
    where[1:, 0::2] = np.cumsum(np.maximum(counts, 0), axis=0)[:-1]
    where[counts[:, 0] < 0] = (0, -1, 0, 0, 0, 0)
    sweeps = []
    # (slices of the five long arrays: views, no copies)
    for (offset, size, address), (e, ne, r, nr, m, nm) in zip(spans, where.tolist()):
        if ne < 0:
            sweeps.append(undecodable(data[offset:offset + size], address))
            continue
        sweeps.append(Sweep(edges[e:e + ne], rows[r:r + nr], kinds[r:r + nr],
                            targets[r:r + nr], marked[m:m + nm]))
    return SweepBatch(sweeps, made[0], made[1], made[2], made[3], made[4], where)


def _native_arrays(data: bytes, table: np.ndarray) -> tuple:
    """The native sweep of the functions of `table` (rows: offset in `data`, size,
    address): its arrays (edges, rows, kinds, targets, marked, counts), then the bytes
    they are read from."""
    made = native_sweep.sweep_functions(
        data, table[:, 0].tobytes(), table[:, 1].tobytes(), table[:, 2].tobytes(),
        (PLAIN, CALL, JUMP, BRANCH, RETURN, OTHER))
    return tuple(np.frombuffer(made[k], dtype=np.uint8 if k == 2 else np.int64)
                 for k in range(6)) + (made,)


def python_sweep(code: bytes, address: int, undecodable: Undecodable) -> Sweep:
    """The sweep by a loop over iced-x86's instructions: only those that branch are
    looked at twice."""
    starts, rows, kinds, targets, marked = [], [], [], [], []
    decoder = iced_x86.Decoder(64, code, ip=address)
    for insn in decoder:
        starts.append(insn.ip)
        flow = insn.flow_control
        if flow == _NEXT:
            continue
        code_ = insn.code
        if code_ == _INVALID:
            return undecodable(code, address)
        if flow not in _UNMARKED:  # (any branch or call: needs_detail may say yes)
            marked.append(len(starts) - 1)
        kind = _ICED_KINDS.get(flow, OTHER)
        if kind in (CALL, JUMP, BRANCH) and insn.op0_kind not in _NEAR_BRANCH:
            kind = PLAIN if kind == CALL else OTHER  # syscall, far forms
        if kind == BRANCH and insn.mnemonic in _COUNTED:
            kind = OTHER  # loop, jrcxz: exit_kind refuses them as exits
        elif kind == RETURN and code_ not in _NEAR_RETURNS:
            kind = OTHER
        elif kind == PLAIN:
            if code_ not in _XBEGIN:
                continue
            kind = CALL  # its abort path goes to its target
        rows.append(len(starts) - 1)
        kinds.append(kind)
        targets.append(insn.near_branch_target if kind in (CALL, JUMP, BRANCH) or
                       flow == _CONDITIONAL else -1)
    starts.append(address + decoder.position)
    edges = np.array(starts, dtype=np.int64)
    # landing pads, by their bytes (rare but at function entries): the instruction
    # that holds them
    at = code.find(ENDBR64)
    if at >= 0:
        pads = set()
        while at >= 0:
            k = bisect.bisect_right(starts, address + at) - 1
            if 0 <= k < len(starts) - 1:
                pads.add(k)
            at = code.find(ENDBR64, at + 1)
        marked = sorted(pads.union(marked))  # (else already in order, each once)
    return Sweep(edges, np.array(rows, dtype=np.int64), np.array(kinds, dtype=np.uint8),
                 _int64(targets), np.array(marked, dtype=np.int64))


def _int64(targets: list) -> np.ndarray:
    """Targets as int64, wrapped as the native sweep wraps them: a branch below address
    0 (in bytes that are no real code) is 2**64 less a little to iced-x86."""
    try:
        return np.array(targets, dtype=np.int64)
    except OverflowError:
        return np.array([t - (1 << 64) if t >= 1 << 63 else t for t in targets],
                        dtype=np.int64)
