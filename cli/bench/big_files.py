"""Big files (--big FILE): time and peak memory of `list`, a one-probe rewrite and an
every-function rewrite of a given program or library (node, libLLVM), each in a
fresh process, as a build step pays them."""

from __future__ import annotations

import contextlib
import json
import os
from typing import List

from urewrite.bench.common import BenchError, log
from urewrite.bench.rewrite_cost import _peak_rss_run

# the limits (#13), on a 2-core machine: seconds, MiB
LIMITS = {"list": (10, 1024), "one probe": (3, 1024), "every function": (30, 2048)}


def one_probe_name(path: str) -> str:
    """`main` where the file has it, else its first exported function."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.functions import discover
    functions = discover(ElfFile.open(path))
    names = {name for f in functions for name in f.names}
    if "main" in names:
        return "main"
    exported = next((f for f in functions if f.origin == "dynsym"), None)
    if exported is None:
        raise BenchError(f"{path}: no main and no exported function to probe")
    return exported.name


def big_file_bench(work: str, paths: List[str]) -> dict:
    rows = []
    for path in paths:
        out = os.path.join(work, os.path.basename(path) + ".probed")
        name = one_probe_name(path)
        row = {"file": path, "file_bytes": os.path.getsize(path), "one_probe_name": name}
        for step, args in (("list", ["list", "--json", "-q", path]),
                           ("one probe", [path, "--json", "-o", out, "-p", name]),
                           ("every function", [path, "--json", "-q", "-o", out, "-p", "*"])):
            log(f"big file {os.path.basename(path)}: {step}")
            seconds, rss, stdout = _peak_rss_run(args)
            result = json.loads(stdout)
            count = len(result["functions"]) if step == "list" else \
                len({p["name"] for p in result["probes"]})
            row[step] = {"seconds": seconds, "peak_rss_mib": rss,
                         "functions" if step == "list" else "probes": count}
        with contextlib.suppress(OSError):
            os.unlink(out)
        rows.append(row)
    return {"rows": rows, "limits": LIMITS}
