"""`list` of a big file works out sweeps, branch targets, exits, windows and redirection
problems ahead, for every function at once and on both cores (Planner.prepare,
Planner.precompute). What it reports must be what one process finds when it asks
function by function."""

import os

import pytest

from urewrite import commands
from urewrite.rewriter import parallel, pipeline

PERL = "/usr/bin/perl"  # (2,234 functions, 42 of them with return probes that redirect)


@pytest.mark.skipif(not os.path.exists(PERL), reason="needs Debian's perl")
def test_list_worked_out_ahead_is_list_function_by_function(monkeypatch):
    ahead = commands._list_rows(PERL, None)
    functions = ahead[0]
    assert len(functions) >= pipeline.PREPARE_AT  # (else nothing was worked out ahead)
    mechanisms = {f["return"]["mechanism"] for f in functions}
    assert {"exit sites", "redirection", None} <= mechanisms, mechanisms  # (each path taken)

    monkeypatch.setattr(pipeline, "PREPARE_AT", 1 << 30)
    monkeypatch.setattr(parallel, "cores", lambda: 1)
    assert commands._list_rows(PERL, None) == ahead
