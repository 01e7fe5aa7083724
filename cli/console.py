"""How a command ends: one line and a non-zero status for bad input (fail), or at once
when the process is the program itself (end_now)."""

from __future__ import annotations

import os
import sys

import click

EXIT_ERROR = 1  # bad input, or a probe that cannot be placed

_owns_process = False  # set by own_process(): the process ends with the command


def own_process() -> None:
    """The process is the program (console script, `python -m urewrite`), not a caller
    of its commands such as a test: end_now() may end it."""
    global _owns_process
    _owns_process = True


def fail(message: str) -> None:
    click.echo(f"urewrite: {message}", err=True)
    sys.exit(EXIT_ERROR)


def end_now(_kept=None) -> None:
    """End the process (status 0) without freeing what it made (such as `_kept`), when
    it is the program: a big file's analysis is millions of objects, and freeing them
    one by one takes a noticeable time. Under another caller (tests), just return."""
    if _owns_process:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            return  # (the usual exit reports it)
        os._exit(0)
