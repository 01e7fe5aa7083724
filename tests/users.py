"""Unprivileged users for the tests of processes that switch user (started through
setpriv, or samples/dropping_server.c's workers): nobody, and daemon as a second one."""

from __future__ import annotations

import os
import pwd
import shutil
from typing import Optional, Tuple

import pytest

# samples/dropping_server.c as the tests run it: WORKERS workers (as nobody) serve
# REQUESTS requests each; the calls of handle_request it makes in all
WORKERS, REQUESTS = 5, 40
SERVED = 2 * REQUESTS + WORKERS * REQUESTS + WORKERS * (WORKERS - 1) // 2


def switch_users() -> Optional[Tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    """The password entries of nobody and daemon; None without either."""
    try:
        return pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    except KeyError:
        return None


def nobody_ids() -> Tuple[int, int]:
    nobody = switch_users()[0]
    return nobody.pw_uid, nobody.pw_gid


# skips unless this process may switch to those users
needs_switching = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not switch_users(),
    reason="needs root (to switch user), setpriv and the users nobody and daemon")
