"""Rewrite scaling (--rewrite-scaling): time and peak memory of a rewrite of a
generated program as the number of probes grows."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

from urewrite.bench.common import BenchError, clean_env, log


def generated_program(work: str, functions: int, cc: str = "gcc",
                      calls_of: Optional[Callable[[int], int]] = None) -> str:
    """A C program with `functions` small noinline functions f<i>, all called from
    main: once each, or `calls_of(i)` times."""
    source = os.path.join(work, "many.c")
    with open(source, "w") as f:
        f.write("#include <stdio.h>\n")
        for i in range(functions):
            f.write(f"__attribute__((noinline)) int f{i}(int x) "
                    f"{{ return x * {i % 7 + 2} + {i}; }}\n")
        f.write("int main(void) {\n  int x = 0;\n")
        for i in range(functions):
            if calls_of is None:
                f.write(f"  x = f{i}(x);\n")
            else:
                f.write(f"  for (int k = 0; k < {calls_of(i)}; k++) x = f{i}(x);\n")
        f.write('  printf("%d\\n", x);\n  return 0;\n}\n')
    binary = os.path.join(work, "many")
    proc = subprocess.run([cc, "-O2", source, "-o", binary], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot build the generated program: {proc.stderr.strip()}")
    return binary


def _peak_rss_run(args: Sequence[str]) -> tuple:
    """(seconds, peak RSS MiB, stdout) of `python -m urewrite ARGS`, from wait4."""
    out_file = tempfile.TemporaryFile()
    err_file = tempfile.TemporaryFile()
    try:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "urewrite", *args], stdout=out_file,
                                stderr=err_file, env=clean_env())
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            os.waitpid(proc.pid, 0)
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out_file.seek(0)
        err_file.seek(0)
        if proc.returncode != 0:
            raise BenchError(f"urewrite {' '.join(args[:3])} ... failed: "
                             f"{err_file.read().decode(errors='replace').strip()}")
        return seconds, usage.ru_maxrss / 1024, out_file.read().decode()
    finally:
        out_file.close()
        err_file.close()


def probe_counts(functions: int) -> List[int]:
    return [n for n in (1, 10, 100, 1000, 5000) if n < functions] + [functions]


def rewrite_scaling(work: str, functions: int = 10000) -> dict:
    """Time and peak memory of `urewrite` on a generated program with `functions`
    functions, probing 1, 10, 100, 1000, 5000 of them (spread over the file) and all
    of them, each in a fresh process (what a user's build step pays), and with every
    function of the file ('*': crt functions too)."""
    log(f"rewrite scaling: building a program with {functions} functions")
    binary = generated_program(work, functions)
    out = binary + ".probed"
    rows = []
    for n in probe_counts(functions):
        names = [f"f{i * functions // n}" for i in range(n)]
        args = [binary, "--json", "-o", out] + [a for name in names for a in ("-p", name)]
        rows.append(_scaling_row(n, names, args))
    rows.append(_scaling_row(None, ["*"], [binary, "--json", "-o", out, "-p", "*"]))
    # what each further probe cost, between one count and the next ('*' is not one of them)
    rows[0]["marginal_ms_per_probe"] = rows[-1]["marginal_ms_per_probe"] = None
    for a, b in zip(rows[:-2], rows[1:-1]):
        b["marginal_ms_per_probe"] = 1e3 * (b["seconds"] - a["seconds"]) / (b["probes"]
                                                                          - a["probes"])
    with contextlib.suppress(OSError):
        os.unlink(out)
    return {"functions": functions, "file_bytes": os.path.getsize(binary), "rows": rows}


def _scaling_row(n: Optional[int], names: List[str], args: List[str]) -> dict:
    log(f"rewrite scaling: {'every function' if n is None else n} probe(s)")
    seconds, rss, stdout = _peak_rss_run(args)
    placed = len({p["name"] for p in json.loads(stdout)["probes"]})
    return {"requested": "*" if n is None else n, "probes": placed, "seconds": seconds,
            "peak_rss_mib": rss}
