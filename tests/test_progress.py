"""Progress bars on stderr: every long step of a big file's `list` and rewrite shows one
when stderr is a terminal (a pseudo-terminal here), each reaching 100%; none with -q,
none when stderr is not a terminal. A file of 2,000 functions or more is analysed
whole, on both cores: those steps report the work of both processes."""

import os
import pty
import re
import subprocess
import sys

import pytest

from conftest import clean_env, urewrite
from urewrite.rewriter import parallel

BIG = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"  # (4,865 functions)
LIST_STEPS = ["analysing functions", "finding exits", "entries"]
REWRITE_STEPS = ["analysing functions", "finding windows", "planning", "generating trampolines"]


def on_a_terminal(*args) -> str:
    """What `urewrite ARGS` writes to stderr when that is a terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "urewrite", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave, env=clean_env())
    os.close(slave)
    written = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # (EIO: the terminal's other end is closed)
            break
        if not chunk:
            break
        written += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0, written.decode(errors="replace")[-2000:]
    return written.decode(errors="replace")


def steps(stderr: str) -> list:
    """The labels of the bars drawn, in order, each once, and whether each reached 100%."""
    seen = {}
    stderr = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stderr)  # (the cursor hidden, shown)
    for label, percent in re.findall(r"([a-z][a-z ]*[a-z])\s+\[[#-]+\]\s+(\d+)%", stderr):
        seen[label] = max(seen.get(label, 0), int(percent))
    return [(label, percent == 100) for label, percent in seen.items()]


@pytest.fixture(scope="module")
def big():
    if not os.path.exists(BIG):
        pytest.skip(f"needs Debian's {BIG}")
    return BIG


def test_list_shows_each_step(big):
    assert steps(on_a_terminal("list", big)) == [(s, True) for s in LIST_STEPS]


def test_rewrite_shows_each_step(big, tmp_path):
    shown = on_a_terminal(big, "-p", "*", "-o", str(tmp_path / "all.so"))
    assert steps(shown) == [(s, True) for s in REWRITE_STEPS]


def test_quiet_and_not_a_terminal_show_none(big, tmp_path):
    assert steps(on_a_terminal("list", "-q", big)) == []
    assert steps(on_a_terminal(big, "-q", "-p", "*", "-o", str(tmp_path / "q.so"))) == []
    proc = urewrite("list", big)  # (stderr a pipe)
    assert proc.returncode == 0 and "[" not in proc.stderr


def test_shares_tell_progress_of_every_item_once():
    """The shares of two processes: the one that draws the bar is told, as it takes
    each piece, of the items handed out to both, and of all of them at the end."""
    shares = parallel.Shares.of(list(range(1000)), 64)
    told = []
    child = parallel.Forked(lambda: sum(len(p) for p in shares.take()))
    mine = sum(len(p) for p in shares.take(progress=told.append))
    shares.done(told.append)
    assert mine + child.result() == 1000
    assert sum(told) == 1000 and all(n > 0 for n in told)
    alone = parallel.Shares.of(list(range(10)), 4)
    told = []
    assert [len(p) for p in alone.take(progress=told.append)] == [3, 3, 3, 1]
    assert told == [3, 3, 3]  # (each piece taken tells of those handed before it)
    alone.done(told.append)
    assert told == [3, 3, 3, 1]
    ones = parallel.Shares(["a", 7, None])  # (pieces that are items: one each)
    told = []
    assert list(ones.take(progress=told.append)) == ["a", 7, None]
    ones.done(told.append)
    assert told == [1, 1, 1]
