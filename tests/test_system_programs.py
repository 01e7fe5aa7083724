"""Debian programs nobody here wrote, with every function probed at entry and return,
all tactics allowed: each runs a small workload exactly as the original, armed (under
`stat`) and disarmed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import urewrite
from urewrite.trampolines.region import read_regions

# program -> (arguments, standard input); each touches a good part of its code
WORKLOADS = {
    "bash": (["-c", 'f() { local n=$1; (( n <= 1 )) && echo 1 && return; echo $(( n * $(f $((n-1))) )); }; '
                    'f 12; a=(z y x); IFS=,; echo "${a[*]}"; printf "%05.1f|%s\\n" 3.14159 "$(echo hi | tr a-z A-Z)"; '
                    'for i in {1..3}; do case $i in 2) echo two;; *) echo "n$i";; esac; done'], ""),
    "perl": (["-e", 'my %h = map { $_ => length } qw(alpha beta gamma); '
                    'print join(",", map {"$_=$h{$_}"} sort keys %h), "\\n"; '
                    '$_ = "a1b22c333"; s/(\\d+)/$1*2/ge; print "$_\\n"; '
                    'eval { die "boom\\n" }; print "caught $@"; '
                    'printf("%.3f\\n", atan2(1,1)*4); print scalar(reverse "perl"), "\\n"'], ""),
    "sed": (["-E", "s/([a-z]+) ([0-9]+)/\\2:\\1/; /^3/d; y/abc/XYZ/"],
            "cab 1\nbca 22\ndog 3\nabc 44\n"),
    "gzip": (["-c", "-9"], "the quick brown fox " * 500),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_program_with_every_function_probed_runs_as_the_original(name, tmp_path):
    path = shutil.which(name)
    if path is None or not os.path.realpath(path).startswith("/usr/bin/"):
        pytest.skip(f"needs Debian's {name}")
    args, stdin = WORKLOADS[name]
    probed = tmp_path / f"{name}.probed"
    out = urewrite(path, "-p", "*", "-r", "*", "-q", "--json", "-o", str(probed))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    used = {t for t, n in result["tactics"].items() if n}
    assert used >= {"jump", "hop", "evict"}  # each of these has tight sites (some a pun)

    def execute(program, env=None):
        return subprocess.run([str(program), *args], input=stdin.encode(), capture_output=True,
                              env={**os.environ, **(env or {})}, timeout=120)

    original = execute(path)
    disarmed = execute(probed)
    assert (disarmed.returncode, disarmed.stdout, disarmed.stderr) == \
        (original.returncode, original.stdout, original.stderr)
    regions = tmp_path / "regions"
    regions.mkdir()
    armed = execute(probed, {"UREWRITE_DIR": str(regions)})
    assert (armed.returncode, armed.stdout, armed.stderr) == \
        (original.returncode, original.stdout, original.stderr)
    hits = sum(p.hits for r in read_regions(str(regions)) for p in r.probes)
    assert hits > 1000
