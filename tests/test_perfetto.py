"""`urewrite trace --format perfetto`: Chrome trace-event JSON, checked for its structure
against the exact calls of samples/call_tree.c (threads, each a recursion); and the
time resolution of `trace`'s text and JSON events."""

from __future__ import annotations

import io
import json
import re
from collections import Counter

import pytest

from conftest import urewrite

THREADS, ROUNDS, DEPTH = 3, 4, 5  # call_tree's defaults
LEVELS = ROUNDS * (DEPTH + 1)  # descend calls (and leaf calls) per thread


def _sum_of_squares(n: int) -> int:
    return n * (n + 1) * (2 * n + 1) // 6


@pytest.fixture(scope="module")
def call_tree(builder, tmp_path_factory):
    built = builder.build("call_tree", ["call_tree.c"], ["-O2", "-pthread"])
    probed = tmp_path_factory.mktemp("perfetto") / "call_tree.probed"
    proc = urewrite(built.path, "-p", "main", "-r", "main", "-p", "worker", "-r", "worker",
                    "-p", "descend", "-r", "descend", "-p", "leaf", "--args", "1",
                    "-o", probed)
    assert proc.returncode == 0, proc.stderr
    return probed


@pytest.fixture(scope="module")
def perfetto(call_tree):
    trace = call_tree.parent / "trace.json"
    proc = urewrite("trace", "--format", "perfetto", "-o", trace, "--", call_tree)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"total={THREADS * ROUNDS * _sum_of_squares(DEPTH)}\n"
    assert "lost" not in proc.stderr
    document = json.loads(trace.read_text())
    assert document["displayTimeUnit"] == "ns"
    return document["traceEvents"]


def _by_thread(events):
    threads = {}
    for e in events:
        if e["ph"] != "M":
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
    return threads


def test_one_named_track_per_thread(perfetto):
    threads = _by_thread(perfetto)
    assert len(threads) == THREADS + 1 and len({pid for pid, _ in threads}) == 1
    [pid] = {pid for pid, _ in threads}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in perfetto
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names) == set(threads)  # one thread_name per track, none without events
    workers = sorted(names[k] for k in threads if k[1] != pid)
    assert workers == [f"tree-{k}" for k in range(1, THREADS + 1)]
    assert [e["args"]["name"] for e in perfetto if e["ph"] == "M"
            and e["name"] == "process_name"] == ["call_tree.probed"]


def test_slices_balance_nest_and_count_one_per_call(perfetto):
    threads = _by_thread(perfetto)
    [pid] = {pid for pid, _ in threads}
    for (_, tid), events in threads.items():
        ts = [e["ts"] for e in events]
        assert ts == sorted(ts), tid  # in time order on each track
        stack, deepest, slices = [], 0, Counter()
        for e in events:
            if e["ph"] == "B":
                stack.append(e)
                deepest = max(deepest, sum(s["name"] == "descend" for s in stack))
            elif e["ph"] == "E":
                begin = stack.pop()  # never an E without its B
                assert (e["name"], e["cat"]) == (begin["name"], begin["cat"])
                assert e["ts"] >= begin["ts"]
                assert "returned" not in e["args"]  # every call of call_tree returns
                if begin["name"] == "descend":  # the arguments went to their own call
                    assert e["args"] == {"return": _sum_of_squares(begin["args"]["arg0"])}
                slices[begin["name"]] += 1
        assert stack == []  # balanced
        instants = Counter(e["name"] for e in events if e["ph"] == "i")
        if tid == pid:
            assert slices == {"main": 1} and not instants
        else:
            assert slices == {"worker": 1, "descend": LEVELS}
            assert instants == {"leaf": LEVELS}
            assert deepest == DEPTH + 1  # the recursion nests
            levels = Counter(e["args"]["arg0"] for e in events if e["ph"] == "i")
            assert levels == {n: ROUNDS for n in range(DEPTH + 1)}


def test_perfetto_slices_match_the_json_events(call_tree, perfetto):
    """The same program traced as JSON lines: one B per entry event and one E per
    return event of the functions probed at both, one instant per other event."""
    events = call_tree.parent / "events.jsonl"
    assert urewrite("trace", "--json", "-o", events, "--", call_tree).returncode == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = Counter((e["probe"], e["kind"]) for e in lines)
    assert kinds == {("main", "entry"): 1, ("main", "return"): 1,
                     ("worker", "entry"): THREADS, ("worker", "return"): THREADS,
                     ("descend", "entry"): THREADS * LEVELS,
                     ("descend", "return"): THREADS * LEVELS,
                     ("leaf", "entry"): THREADS * LEVELS}
    phases = Counter((e["ph"], e["name"]) for e in perfetto if e["ph"] != "M")
    assert phases == {("B", p) if k == "entry" else ("E", p): n
                      for (p, k), n in kinds.items() if p != "leaf"} | \
        {("i", "leaf"): THREADS * LEVELS}


def test_json_and_text_times_resolve_below_a_microsecond(call_tree):
    events = call_tree.parent / "times.jsonl"
    assert urewrite("trace", "--json", "-o", events, "--", call_tree).returncode == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    per_thread = {}
    for e in lines:
        assert isinstance(e["ts_ns"], int)
        per_thread.setdefault(e["tid"], []).append(e["ts_ns"])
    gaps = [b - a for ts in per_thread.values() for a, b in zip(ts, ts[1:])]
    assert all(g >= 0 for g in gaps)
    assert sum(0 < g < 1000 for g in gaps) > len(gaps) // 2  # most calls: ns apart
    text = urewrite("trace", "--", call_tree).stdout.splitlines()
    assert text[0].split()[:2] == ["TIME(s)", "PID"]
    times = [line.split()[0] for line in text[1:] if "call_tree.probed:" in line]
    assert len(times) == len(lines)
    assert all(re.fullmatch(r"\d+\.\d{9}", t) for t in times)
    ns = [int(t.replace(".", "")) for t in times]
    # many events less than 1 us apart, and they print as different times
    assert sum(0 < b - a < 1000 for a, b in zip(ns, ns[1:])) > len(ns) // 4


def test_json_and_perfetto_options_must_agree(call_tree):
    proc = urewrite("trace", "--json", "--format", "perfetto", "--", call_tree)
    assert proc.returncode == 2 and "--json and --format perfetto disagree" in proc.stderr


# -- the writer's bookkeeping on event streams no program gives in order -------------------

def _events(spec):
    """(tid, ts_ns, kind, address, probe, args, paired) -> Events of pid 1."""
    from urewrite.trampolines.ring import Event
    return [Event(1, "obj", probe, kind, ts, tid, args, address, paired)
            for tid, ts, kind, address, probe, args, paired in spec]


def _write(spec):
    from urewrite.reader.perfetto import PerfettoWriter
    out = io.StringIO()
    writer = PerfettoWriter(out)
    writer.write(_events(spec))
    writer.close()
    return [e for e in json.loads(out.getvalue())["traceEvents"] if e["ph"] != "M"]


def test_calls_left_without_returning_end_with_the_call_that_returns():
    """f calls g calls h; h longjmps back into f, which returns: g and h end there."""
    out = _write([(7, 100, "entry", 0x10, "f", [], True),
                  (7, 200, "entry", 0x20, "g", [], True),
                  (7, 300, "entry", 0x30, "h", [], True),
                  (7, 900, "return", 0x10, "f", [5], True)])
    assert [(e["ph"], e["name"], e["ts"], e["args"]) for e in out] == [
        ("B", "f", 0.0, {}), ("B", "g", 0.1, {}), ("B", "h", 0.2, {}),
        ("E", "h", 0.8, {"returned": False}), ("E", "g", 0.8, {"returned": False}),
        ("E", "f", 0.8, {"return": 5})]


def test_recursion_closes_the_innermost_call_and_the_trace_end_closes_the_rest():
    out = _write([(7, 1000, "entry", 0x10, "f", [1], True),
                  (7, 1001, "entry", 0x10, "f", [2], True),
                  (7, 1002, "return", 0x10, "f", [20], True),
                  (8, 1500, "entry", 0x10, "f", [3], True),  # another thread's call
                  (7, 2000, "entry", 0x40, "usdt:x", [9], False)])
    assert [(e["ph"], e["tid"], e["ts"], e["args"]) for e in out] == [
        ("B", 7, 0.0, {"arg0": 1}), ("B", 7, 0.001, {"arg0": 2}),
        ("E", 7, 0.002, {"return": 20}), ("B", 8, 0.5, {"arg0": 3}),
        ("i", 7, 1.0, {"arg0": 9}),
        ("E", 7, 1.0, {"returned": False}), ("E", 8, 0.5, {"returned": False})]


def test_a_return_whose_entry_was_lost_is_an_instant():
    out = _write([(7, 10, "return", 0x10, "f", [1 << 60], True)])
    assert [(e["ph"], e["args"]) for e in out] == [
        ("i", {"return": hex(1 << 60), "entry_lost": True})]


def test_events_lost_from_a_full_ring_never_pair_the_wrong_calls(call_tree):
    """One thread, a ring of 16 events, rounds of 18 events 30 ms apart: the reader
    catches up between rounds, each round loses its first events (descend(5)'s and
    descend(4)'s entries). The calls open across a loss (main, worker) end there,
    marked; the returns whose entries were lost are instants; every other slice is
    still one call, with its own argument and return value."""
    rounds = 4
    trace = call_tree.parent / "lossy.json"
    proc = urewrite("trace", "--format", "perfetto", "--ring", 16, "-o", trace, "--",
                    call_tree, 1, rounds, DEPTH, 30)
    assert proc.returncode == 0, proc.stderr
    lost = sum(int(n) for n in re.findall(r"(\d+) of \d+ events lost", proc.stderr))
    assert lost > 0
    events = json.loads(trace.read_text())["traceEvents"]
    cut, whole = Counter(), 0
    for track in _by_thread(events).values():
        stack = []
        for e in track:
            if e["ph"] == "B":
                stack.append(e)
            elif e["ph"] == "E":
                begin = stack.pop()
                assert e["name"] == begin["name"]
                if e["args"].get("events_lost"):
                    cut[e["name"]] += 1
                elif begin["name"] == "descend":
                    whole += 1
                    assert e["args"] == {"return": _sum_of_squares(begin["args"]["arg0"])}
        assert stack == []
    assert cut == {"main": 1, "worker": 1} and whole > 0
    assert all(e["args"].get("entry_lost") for e in events
               if e["ph"] == "i" and e["name"] != "leaf")
    # every event is delivered (a B, an E that is a return, an instant) or counted lost
    delivered = sum(e["ph"] in "Bi" or (e["ph"] == "E" and "return" in e["args"])
                    for e in events)
    assert delivered + lost == 2 + 2 + 3 * rounds * (DEPTH + 1)


def test_a_loss_ends_the_open_calls_of_its_object_in_its_process():
    spec = [(7, 100, "entry", 0x10, "f", [], True),
            (7, 200, "entry", 0x20, "g", [], True),
            (8, 300, "entry", 0x20, "g", [], True),
            (7, 400, "return", 0x20, "g", [1], True)]
    from urewrite.reader.perfetto import PerfettoWriter
    events = _events(spec)
    events[-1].after_loss = True  # (g's return on thread 7 came after lost events)
    out = io.StringIO()
    writer = PerfettoWriter(out)
    writer.write(events)
    writer.close()
    got = [(e["ph"], e["tid"], e["name"], e["ts"], e["args"])
           for e in json.loads(out.getvalue())["traceEvents"] if e["ph"] != "M"]
    assert got == [("B", 7, "f", 0.0, {}), ("B", 7, "g", 0.1, {}), ("B", 8, "g", 0.2, {}),
                   ("E", 7, "g", 0.1, {"events_lost": True}),
                   ("E", 7, "f", 0.1, {"events_lost": True}),
                   ("E", 8, "g", 0.2, {"events_lost": True}),
                   ("i", 7, "g", 0.3, {"return": 1, "entry_lost": True})]
