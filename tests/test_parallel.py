"""parallel.Shares: pieces of work taken by a process and its forked child as each goes,
every piece by exactly one of them."""

import time

from urewrite.rewriter import parallel


def _take(shares, leave=0):
    took = []
    for piece in shares.take(leave):
        time.sleep(0.002)  # (work: the other process gets its turns)
        took.append(piece)
    return took


def test_a_process_and_its_child_take_every_piece_once():
    shares = parallel.Shares(list(range(300)))
    child = parallel.Forked(lambda: _take(shares, leave=40))
    mine = _take(shares)
    theirs = child.result()
    assert sorted(mine + theirs) == list(range(300))  # none twice, none lost
    if parallel.cores() >= 2:  # (else the child's work ran here, after this process's)
        assert len(theirs) > 50 and len(mine) > 50
        assert max(theirs) < 260  # it left the last 40 to this process
        assert set(range(260, 300)) <= set(mine)


def test_pieces_of_a_list():
    pieces = parallel.Shares.of(list(range(10)), 4)
    assert list(pieces.take()) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert list(parallel.Shares.of([], 4).take()) == []


def test_alone_a_process_takes_them_in_order():
    shares = parallel.Shares(["a", "b", "c", "d", "e"])
    assert list(shares.take(leave=2)) == ["a", "b", "c"]
    assert list(shares.take()) == ["d", "e"]
    assert list(shares.take()) == []
