"""`list` of a big file works out sweeps, branch targets, exits, windows and redirection
problems ahead, for every function at once and on both cores (Planner.prepare,
Planner.precompute). What it reports must be what one process finds when it asks
function by function."""

import os
import shutil
import subprocess

import pytest

from urewrite import api
from urewrite.rewriter import parallel, pipeline

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
PERL = "/usr/bin/perl"  # (2,234 functions, 42 of them with return probes that redirect)


@pytest.mark.skipif(not os.path.exists(PERL), reason="needs Debian's perl")
def test_list_worked_out_ahead_is_list_function_by_function(monkeypatch):
    ahead = api.list_sites(PERL)
    functions = ahead.functions
    assert len(functions) >= pipeline.PREPARE_AT  # (else nothing was worked out ahead)
    mechanisms = {f.return_probe.mechanism for f in functions}
    assert {"exit sites", "redirection", None} <= mechanisms, mechanisms  # (each path taken)

    monkeypatch.setattr(pipeline, "PREPARE_AT", 1 << 30)
    monkeypatch.setattr(parallel, "cores", lambda: 1)
    assert api.list_sites(PERL) == ahead


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
@pytest.mark.parametrize("flags", [["-O2", "-fcf-protection=full"], ["-O0"]])
def test_a_rewrite_worked_out_ahead_is_the_same_file(flags, tmp_path, monkeypatch):
    """A rewrite of many sites finds their windows ahead too (on both cores), then
    decodes them in detail where the trampolines are made: the same file as one
    planned site by site. (With landing pads: an entry's probe point follows its
    endbr64, which the windows found ahead once put at the function's address.)"""
    plain = tmp_path / "landing_pads"
    subprocess.run(["g++", *flags, os.path.join(SAMPLES, "landing_pads.cc"), "-o", plain],
                   check=True)
    outputs = []
    for prepare_at in (1, 1 << 30):  # (every rewrite ahead; none)
        monkeypatch.setattr(pipeline, "PREPARE_AT", prepare_at)
        out = tmp_path / str(prepare_at) / "probed"  # (the same name: it is in the file)
        out.parent.mkdir()
        result = pipeline.rewrite(str(plain), str(out), ["*"], keep_going=True,
                                  return_specs=["*"])
        assert result.plans
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
