"""Running commands for the CMake and Bazel tests: probes disarmed, and the interpreter
running the tests first on PATH (CMake records how to run urewrite from it; Bazel passes
PATH on to actions that use the default shell environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT = 300


def env():
    e = {k: v for k, v in os.environ.items() if k != "UREWRITE_DIR"}
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    return e


def run(cmd, cwd=None, extra_env=None):
    e = env()
    e.update(extra_env or {})
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                          cwd=cwd, env=e, timeout=TIMEOUT)


def check(cmd, **kw):
    proc = run(cmd, **kw)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} exited with {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def urewrite(*args, **kw):
    return run([sys.executable, "-m", "urewrite", *args], **kw)


def stat(cmd, tmp: Path, extra_env=None):
    """Hits per probe of `cmd` under `urewrite stat --json` (return probes as
    "name (return)"), and the program's stdout."""
    report = tmp / "report.json"
    proc = urewrite("stat", "--json", "-o", report, "--", *cmd, extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    return {p["name"] if p["kind"] in ("entry", "usdt") else f'{p["name"]} ({p["kind"]})':
            p["hits"] for p in data["probes"]}, proc.stdout
