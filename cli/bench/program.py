"""The trigger program: built from the shipped share/bench/trigger.c, rewritten by
urewrite, its probe sites found, and run once."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, Optional

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env

TRIGGERS = ("nop", "push", "ret")  # functions; "usdt" is the USDT site
TRIGGER_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "share", "bench", "trigger.c")


def build_target(work: str, cc: str = "gcc") -> str:
    """Compile the shipped trigger source; the path of the program."""
    if shutil.which(cc) is None:
        raise BenchError(f"{cc} is not installed: the bench builds its target with it")
    out = os.path.join(work, "trigger")
    proc = subprocess.run([cc, "-O2", "-pthread", TRIGGER_SOURCE, "-o", out],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"cannot build the trigger target:\n{proc.stderr.strip()}")
    return out


def rewrite_targets(plain: str, work: str) -> Dict[str, str]:
    """Rewritten copies of the target: kind -> path (entry probes + USDT, return, both,
    entries by hop)."""
    from urewrite.rewriter.pipeline import rewrite
    functions = [f"trigger_{t}" for t in TRIGGERS]
    specs = {"entry": (functions + ["usdt:trigger:usdt"], []),
             "return": ([], functions),
             "entry+return": (functions, functions)}
    # the same entries patched with a 2-byte hop to a landing in the padding after
    # them, where the plain jump fits too: what a hop adds (docs/design.md)
    specs["entry-hop"] = (functions, [])
    out = {}
    for kind, (entry, returns) in specs.items():
        path = os.path.join(work, "trigger." + kind.replace("+", "_"))
        result = rewrite(plain, path, entry, return_specs=returns,
                         tactics=("hop",) if kind == "entry-hop" else None)
        if result.refusals:
            r = result.refusals[0]
            raise BenchError(f"urewrite refused {r.site.name} in the bench target: {r.reason}")
        out[kind] = path
    return out


def site_offsets(path: str) -> Dict[str, int]:
    """File offsets of the triggers' first instructions and of the USDT site, for
    kernel uprobes: trigger -> offset."""
    from urewrite.rewriter.elf_file import ElfFile
    from urewrite.rewriter.functions import discover
    from urewrite.rewriter.usdt import discover as discover_usdt
    elf = ElfFile.open(path)
    by_name = {n: fn.address for fn in discover(elf) for n in fn.names}
    addresses = {t: by_name[f"trigger_{t}"] for t in TRIGGERS}
    addresses["usdt"] = next(u.pc for u in discover_usdt(elf) if u.probe == "trigger:usdt")
    return {t: elf.offset_of(a) for t, a in addresses.items()}


def run_trigger(binary: str, trigger: str, iterations: int, threads: int = 1,
                env: Optional[Dict[str, str]] = None) -> float:
    """One run of the loop; the wall-clock ns per hit of all threads."""
    proc = subprocess.run([binary, trigger, str(iterations), str(threads)], capture_output=True,
                          text=True, env=env if env is not None else clean_env(),
                          timeout=RUN_TIMEOUT)
    if proc.returncode != 0:
        raise BenchError(f"{os.path.basename(binary)} {trigger} exited with {proc.returncode}: "
                         f"{proc.stderr.strip()}")
    return float(proc.stdout.split()[0])
