"""What every part of the bench shares: its error, its log line, and the clean
environment and time limit of the programs it runs."""

from __future__ import annotations

import sys
from typing import Dict, Optional

from urewrite.errors import UrewriteError
from urewrite.reader.command_run import command_environment

ENV_VAR = "UREWRITE_DIR"
LATENCY_ENV_VAR = "UREWRITE_LATENCY"
RUN_TIMEOUT = 900  # seconds, for any one run of a target


class BenchError(UrewriteError):
    """The bench could not run, or a count came out wrong: its figures cannot be trusted."""


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in command_environment().items()
           if k not in (ENV_VAR, LATENCY_ENV_VAR)}
    env.update(extra or {})
    return env
