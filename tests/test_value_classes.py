"""The values plans are made of (arch/base.py's value_class: sites, windows, plans) are
made by the 100,000s for a big file: slotted, equal and hashable by their fields, and
pickled between processes (precompute, the rewrite's children) as they were made."""

import pickle
import sys
from dataclasses import replace

import pytest

from urewrite.arch.base import Insn, Window
from urewrite.rewriter.functions import Function
from urewrite.rewriter.plan.results import Hop, Plan, ProbePoint, Pun, Refusal
from urewrite.rewriter.selectors import Site
from urewrite.trampolines.region import KIND_RETURN


def _values() -> list:
    fn = Function("f", 0x1000, 40, "symtab", ("f_alias",))
    site = Site(fn, 0x1000, KIND_RETURN, "f", "f*", False, stays_within=((0x1001, 0x1028),))
    window = Window(0x1010, 6, (Insn(0x1010, 5, "call", "0x2000", b""),
                                Insn(0x1015, 1, "ret", "", b"")))
    point = ProbePoint(0x1015, (site.at_exit(0x1015, False, ()),), False, True)
    hop = Hop(0x1030, Window(0x1030, 5, ()))
    pun = Pun(b"\xe9\x00\x00", 0x5000, window, b"\xeb\x00", 0x5010)
    return [fn, site, window, point, hop, pun, Plan(window, (point,), hop, pun),
            Refusal(site, "why")]


@pytest.mark.parametrize("value", _values(), ids=lambda v: type(v).__name__)
def test_pickled_as_made(value):
    again = pickle.loads(pickle.dumps(value))
    assert type(again) is type(value) and again == value and hash(again) == hash(value)
    assert again is not value


@pytest.mark.skipif(sys.version_info < (3, 10), reason="dataclass slots need Python 3.10")
@pytest.mark.parametrize("value", _values(), ids=lambda v: type(v).__name__)
def test_slotted(value):
    assert not hasattr(value, "__dict__")  # (a frozen dataclass has one: 160 bytes, not 64)


def test_equal_by_fields():
    a, b = _values(), _values()
    assert a == b and [hash(x) for x in a] == [hash(x) for x in b]
    site, plan = a[1], a[6]
    assert replace(site, address=0x1001) != site
    assert replace(plan, hop=None).tactic == "pun" and replace(plan, pun=None).tactic == "evict"


def test_an_exit_site_is_the_return_site_replaced():
    site = _values()[1]
    exit_site = site.at_exit(0x1020, True, ((0x1001, 0x1028),))
    assert exit_site == replace(site, address=0x1020, tail_call=True,
                                stays_within=((0x1001, 0x1028),))
