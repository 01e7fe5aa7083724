"""Windows that borrow the padding after a function (planner.windows.borrow_padding): its
cached reading of the padding gives what decoding the bytes there each time gives."""

import bisect
import os

import pytest

from urewrite.rewriter.pipeline import analyse
from urewrite.rewriter.plan.results import Refused

FILES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11"]


def _decoded_each_time(planner, fn, start, fn_end, size):
    """The padding read by decoding what follows the function, every time."""
    need = start + size
    section = planner.elf.section_at(fn.address)
    gap_end = planner.windows.gap_after(section) if section is not None else 0
    if section is None or need > max(section.end, gap_end):
        return "no padding follows"
    k = bisect.bisect_right(planner.model.starts, fn_end - 1)
    if k < len(planner.model.starts) and planner.model.starts[k] < need:
        return "the next function follows"
    padding = planner.backend.decode(planner.elf.read(
        fn_end, min(need - fn_end + 15, section.end - fn_end)), fn_end)
    at = fn_end
    for insn in padding:
        if at >= need:
            break
        if not planner.backend.is_padding(insn):
            return f"not padding ('{insn}')"
        at = insn.end
    if at < need and at == section.end and need <= gap_end:
        return need
    next_start = planner.model.starts[k] if k < len(planner.model.starts) else section.end
    return "too short" if at < need or at > next_start else at


def _borrowed(planner, fn, start, fn_end, size):
    try:
        return planner.windows.borrow_padding(fn, start, fn_end, size)
    except Refused as why:
        text = str(why)
        return next(short for long_, short in (
            ("no padding follows", "no padding follows"),
            ("the next function follows", "the next function follows"),
            ("is too short", "too short")) if long_ in text) if "is not padding" not in text \
            else "not padding (" + text.split("is not padding (", 1)[1]


@pytest.mark.skipif(not os.path.exists(FILES[0]), reason="needs Debian's x86_64 libc.so.6")
def test_cached_padding_is_what_decoding_each_time_finds():
    outcomes = set()
    for path in [f for f in FILES if os.path.exists(f)]:
        planner = analyse(path).planner
        for fn in planner.functions:
            if not fn.size:
                continue
            for back, size in ((1, 5), (3, 5), (1, 8), (1, 2)):
                start = fn.end - back
                expected = _decoded_each_time(planner, fn, start, fn.end, size)
                assert _borrowed(planner, fn, start, fn.end, size) == expected, \
                    (path, fn.name, back, size)
                outcomes.add(expected if isinstance(expected, str) and "(" not in expected
                             else "not padding" if isinstance(expected, str) else "borrowed")
    # (every way it can go was met: "not padding" in libc, before a syscall)
    assert {"borrowed", "not padding", "no padding follows",
            "the next function follows"} <= outcomes, outcomes
