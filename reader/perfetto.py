"""`urewrite trace --format perfetto`: events as Chrome trace-event JSON.

ui.perfetto.dev and chrome://tracing open it. Each thread is a track (pid, tid,
with process_name and thread_name metadata); a function probed at entry and at
return gives a slice per call ("B" at the entry event, "E" at the return event);
every other probe gives an instant event on its thread's track. Arguments go into
the events' args: `arg0`.. at an entry or USDT probe, `return` at a return.

The events are written as they come, so a long trace is never held in memory.
Only the calls still open are kept, one stack per thread, so that every "B" gets
exactly one "E" on its own track, nested as the calls were:
- a return closes the innermost open call of its function on that thread; calls
  opened inside it and still open were left without returning (longjmp, a C++
  exception: no return is reported for them) and end at the same time, with
  `"returned": false`;
- a return with no open call of its function (its entry event was lost from a full
  ring) is an instant event, with `"entry_lost": true`;
- calls still open when the trace ends (a thread that called exit() from inside a
  probed function, say) end at their thread's last event, with `"returned": false`;
- when a ring lost events (it was full), the calls of its object still open in that
  process end at their thread's last event, with `"events_lost": true`: a return
  among the lost events would otherwise leave the next return to close the wrong call.
Timestamps are microseconds since the first event, with nanosecond digits; the
first event's own clock reading is kept in `otherData`.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, NamedTuple, Optional, TextIO, Tuple

from urewrite.trampolines.ring import Event

# Integers a JavaScript number holds exactly; larger ones are written as hex strings
# (chrome://tracing reads JSON numbers as doubles).
_EXACT_LIMIT = 1 << 53


def _value(v: int):
    return v if -_EXACT_LIMIT < v < _EXACT_LIMIT else hex(v & (1 << 64) - 1)


class _Call(NamedTuple):  # an open call: its entry probe's object, address and name
    object: str
    address: int
    name: str


class PerfettoWriter:
    """Write batches of events with `write(events)`, then `close()` once."""

    def __init__(self, out: TextIO):
        self.out = out
        self.origin: Optional[int] = None  # the first event's ts_ns
        self.stacks: Dict[Tuple[int, int], List[_Call]] = {}  # (pid, tid) -> open calls
        self.last_ts: Dict[Tuple[int, int], int] = {}
        self.pids = set()
        self._first = True
        out.write('{"displayTimeUnit": "ns", "traceEvents": [\n')

    # -- output -------------------------------------------------------------------
    def _emit(self, record: dict) -> None:
        self.out.write(("" if self._first else ",\n") + json.dumps(record))
        self._first = False

    def _ts(self, ts_ns: int) -> float:
        # ns / 1000 prints with its exact nanosecond digits while it has at most 15
        # significant ones: for traces shorter than 11 days
        return (ts_ns - self.origin) / 1000

    def _thread(self, e: Event) -> Tuple[int, int]:
        """The thread's key; names its process and thread on first sight."""
        key = (e.pid, e.tid)
        if key not in self.stacks:
            if e.pid not in self.pids:
                self.pids.add(e.pid)
                self._emit({"ph": "M", "name": "process_name", "pid": e.pid, "tid": e.pid,
                            "args": {"name": _program(e.pid) or e.object}})
            name = _comm(e.pid, e.tid) or (e.object if e.tid == e.pid else f"thread {e.tid}")
            self._emit({"ph": "M", "name": "thread_name", "pid": e.pid, "tid": e.tid,
                        "args": {"name": name}})
            self.stacks[key] = []
        return key

    # -- events -------------------------------------------------------------------
    def write(self, events: List[Event]) -> None:
        for e in events:
            if self.origin is None:
                self.origin = e.ts_ns
            key = self._thread(e)
            if e.after_loss:
                self._forget(e.pid, e.object)
            self.last_ts[key] = max(self.last_ts.get(key, e.ts_ns), e.ts_ns)
            base = {"pid": e.pid, "tid": e.tid, "ts": self._ts(e.ts_ns), "cat": e.object}
            if e.paired and e.kind == "entry":
                self.stacks[key].append(_Call(e.object, e.address, e.probe))
                self._emit({"ph": "B", "name": e.probe, **base, "args": _arguments(e)})
            elif e.paired and e.kind == "return":
                self._end(key, e, base)
            else:
                self._emit({"ph": "i", "s": "t", "name": e.probe, **base,
                            "args": _arguments(e)})
        self.out.flush()

    def _end(self, key, e: Event, base: dict) -> None:
        stack = self.stacks[key]
        depth = next((i for i in range(len(stack) - 1, -1, -1)
                      if stack[i].address == e.address and stack[i].object == e.object), None)
        if depth is None:
            self._emit({"ph": "i", "s": "t", "name": e.probe, **base,
                        "args": {**_arguments(e), "entry_lost": True}})
            return
        while len(stack) > depth + 1:  # left without returning
            call = stack.pop()
            self._emit({"ph": "E", "name": call.name, **dict(base, cat=call.object),
                        "args": {"returned": False}})
        call = stack.pop()
        self._emit({"ph": "E", "name": call.name, **base, "args": _arguments(e)})

    def _forget(self, pid: int, object_: str) -> None:
        """Events of this object in this process were lost: a return among them would
        have closed some of its open calls, and the next return would close the wrong
        one. End them all (and the calls opened inside them), marked, at their
        thread's last event; their returns to come are instants."""
        for key, stack in self.stacks.items():
            if key[0] != pid:
                continue
            lowest = next((i for i, call in enumerate(stack) if call.object == object_), None)
            while lowest is not None and len(stack) > lowest:
                call = stack.pop()
                self._emit({"ph": "E", "name": call.name, "pid": key[0], "tid": key[1],
                            "ts": self._ts(self.last_ts[key]), "cat": call.object,
                            "args": {"events_lost": True}})

    def close(self) -> None:
        """End the calls still open, then the JSON document."""
        for key, stack in self.stacks.items():
            while stack:
                call = stack.pop()
                self._emit({"ph": "E", "name": call.name, "pid": key[0], "tid": key[1],
                            "ts": self._ts(self.last_ts[key]), "cat": call.object,
                            "args": {"returned": False}})
        self.out.write('\n], "otherData": ' + json.dumps(
            {"producer": "urewrite trace", "first_event_ts_ns": self.origin}) + "}\n")
        self.out.flush()


def _arguments(e: Event) -> dict:
    if e.kind == "return":
        return {"return": _value(e.args[0])} if e.args else {}
    return {f"arg{i}": _value(v) for i, v in enumerate(e.args)}


def _program(pid: int) -> Optional[str]:
    """The process's program name as it was started (comm cuts it at 15 characters)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0]
    except OSError:
        return None
    return os.path.basename(argv0.decode(errors="replace")) or None


def _comm(pid: int, tid: int) -> Optional[str]:
    """The thread's name while it runs (a thread already gone has none to read)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip() or None
    except OSError:
        return None
