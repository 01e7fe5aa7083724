"""Compiled probe programs (x86_64) build the maps the reference evaluator builds.

The code of each probe is called here directly, in this process, through ctypes,
with contexts made as the runtime will make them: the same hits go to the evaluator
(programs/evaluate.py, itself held to bpftrace in test_program_output.py) and to the
machine code, and the maps must print the same."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import random
import struct
import threading

import pytest

from urewrite.programs import lower as L
from urewrite.programs import maps as M
from urewrite.programs import output
from urewrite.programs.checks import check
from urewrite.programs.evaluate import Hit, State, printf_text, run_block
from urewrite.programs.parser import parse
from urewrite.trampolines import program_file as P

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="runs x86_64 code here")


class Compiled:
    """A program's code and maps in this process's memory."""

    def __init__(self, text: str):
        from urewrite.arch.x86_64 import program_code
        self.checked = check(parse(text))
        self.lowered = L.lower(self.checked)
        offsets, size = M.layout(self.lowered.maps)
        code, self.entries = program_code.assemble(self.lowered, offsets)
        self.code = mmap.mmap(-1, max(len(code), 1), prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self.code.write(code)
        self.area = mmap.mmap(-1, size)
        self.area.write(bytes(M.initial_area(self.lowered.maps)))
        self.area_address = ctypes.addressof(ctypes.c_char.from_buffer(self.area))
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.code))
        kind = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        self.functions = {probe: kind(base + offset) for probe, offset in self.entries.items()}
        self.printed = []  # printf()s, formatted as the tracer formats the ring's events
        self.exits = 0  # exit()s

        def event(index, words, count):
            from urewrite.program_run import printf_values
            text, kinds = self.lowered.printfs[index]
            if text == L.EXIT:
                self.exits += 1
                return
            action = L.map_action(text)
            if action:  # print(), clear(), zero(): what the tracer does on the event
                what, number = action
                if what == "print":
                    name = self.lowered.maps[number].name
                    self.printed += [output.text([m]) for m in self.maps() if m.name == name]
                else:
                    M.reset(self.area, self.lowered.maps, number, forget=what == "clear")
                return
            self.printed.append(printf_text(text, printf_values(kinds, list(
                (ctypes.c_uint64 * count).from_address(words)))))
        self.event = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)(event)

    def hit(self, probe: str, args=(), retval=0, tid=1, nsecs=0, comm="app"):
        if probe not in self.functions:  # a probe the program does not name
            return
        context = ctypes.create_string_buffer(P.CTX_SIZE)
        args = (retval,) if probe.startswith("uretprobe") else args  # a return's one argument
        struct.pack_into(f"<{len(args)}Q", context, P.CTX_ARGS, *[a & (2**64 - 1) for a in args])
        struct.pack_into("<QQQQ", context, P.CTX_PID, os.getpid(), tid, nsecs, self.area_address)
        struct.pack_into("<Q", context, P.CTX_EVENT, ctypes.cast(self.event, ctypes.c_void_p).value)
        context[P.CTX_COMM:P.CTX_COMM + len(comm)] = comm.encode()
        self.functions[probe](ctypes.addressof(context))

    def maps(self):
        found, self.dropped = M.read(self.area, self.lowered.maps)
        return found


def _both(text: str, hits):
    """The maps the evaluator and the compiled code build from `hits`: (probe text,
    Hit fields) pairs."""
    compiled = Compiled(text)
    state = State(compiled.checked)
    blocks = compiled.checked.program.blocks
    for probe_text, fields in hits:
        for block in blocks:
            for probe in block.probes:
                if probe.text == probe_text:
                    run_block(state, block, Hit(probe, **{"comm": "app", **fields}))
        compiled.hit(probe_text, **{k: v for k, v in fields.items() if k != "function"})
    compiled.evaluated_printed = state.printed
    return output.text(list(state.maps.values())), output.text(compiled.maps()), compiled


WORK = [("uprobe:./v:work", {"args": (i, i % 7)}) for i in range(1000)] + \
       [("uretprobe:./v:work", {"retval": i * 3 - (i % 7) * 500}) for i in range(1000)]

PROGRAMS = {
    "aggregations": """
        uprobe:./v:work { @c[arg1] = count(); @two[arg1, arg1 % 2] = count();
            @h = hist(arg0 - 300); @hk[arg1 % 2] = hist(arg0 * 1000003);
            @l = lhist(arg0, 100, 600, 100); @lk[arg1 % 2] = lhist(arg0, 0, 1000, 500);
            @s[arg1] = sum(arg0); @a = avg(arg0); @ak[arg1 % 2] = avg(arg0);
            @mi = min(arg0 - 500); @ma = max(arg0); @st = stats(arg0); @stk[arg1 % 3] = stats(arg0);
            @v = arg0; @z[arg1] = 5; @ = count(); @neg = max((int64)arg0 - 5000); }
        uretprobe:./v:work /(int64)retval < 0/ { @r = hist(retval); @rmin = min(retval); }""",
    "arithmetic": """
        uprobe:./v:work /arg0 - 500 > 100/ {
            @wrapped = count(); $x = arg0 / 7 + arg0 % 5 - (arg0 << 2 >> 3); @calc = sum($x);
            $y = (int64)arg0 - 600; @sdiv = sum($y / 7 + $y % 5 + ($y >> 2));
            @zdiv = sum(arg0 / (arg1 - arg1) + arg0 % (arg1 * 0));
            if (arg1 > 3) { @big++ } else if (arg1 == 0) { @zero += 2 } else { @small = max(arg1 * 2) }
            @t[arg0 & 1 ? 10 : 20] = count(); @c8 = sum((int8)arg0); @u16 = sum((uint16)(arg0 * 5000));
            @neg8[(int8)(arg0 * 3) < 0] = count(); @logic[arg1 > 2 && arg0 % 3 == 0 || !arg1] = count();
            @bits = sum(~arg0 ^ (arg0 | 3) & 0xff); @m[-(int64)arg0 % 9] = count();
        }""",
    "by_constants": """
        uprobe:./v:work { @d7 = sum(arg0 / 7); @m7 = sum(arg0 % 7); @k[arg0 % 1000] = count();
            @d1000 = sum(arg0 / 1000); @p = sum(arg0 / 64 + arg0 % 64 + arg0 / 1 + arg0 % 1);
            @big = sum(arg0 / 0x8000000000000001 + arg0 % 0xfffffffffffffffd);
            @odd = sum(arg0 / 1000003 + arg0 % 641 + arg0 / -7 + arg0 % -1000);
            @s = sum((int64)arg0 / 7 + (int64)arg0 % 1000); }""",
    "reads_maps": """
        uprobe:./v:work { @seen[arg1] = count(); @last[arg1] = arg0; @acc += arg0;
            @mean = avg(arg0); @r[arg1] = @seen[arg1] * 100 + @mean; }
        uretprobe:./v:work /@seen[3] > 100/ { @after = count(); @key[@last[2] % 4] = count(); }""",
    "printf": """
        uprobe:./v:work /arg0 % 97 == 0/ { printf("%d %u %x|%-4d %s!\\n", (int64)arg0 - 500,
            arg1, arg0, arg1, comm); printf("%5d|\\n", arg1);
            printf("%c%c\\n", 65 + arg1, 97); @n = count(); }
        uretprobe:./v:work /(int64)retval < -2950/ { printf("ret %d\\n", retval); }""",
    "map_actions": """
        uprobe:./v:work { @c[arg1] = count(); @s = sum(arg0); @h = hist(arg0); @lo = min(arg0);
            if (arg0 % 250 == 3) { print(@c); print(@lo); clear(@c); zero(@s); }
            if (arg0 % 400 == 7) { zero(@h); zero(@lo); print(@h); } }
        uretprobe:./v:work /retval % 333 == 0/ { print(@s); }""",
    "latency": """
        uprobe:./v:work { @start[tid] = nsecs; }
        uretprobe:./v:work /@start[tid]/ { @ns = hist(nsecs - @start[tid]); @left[tid] = count();
            delete(@start[tid]); }""",
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_maps_are_the_evaluators(name):
    hits = WORK
    if name == "by_constants":  # dividends across the whole 64 bits
        rng = random.Random(7)
        hits = [("uprobe:./v:work", {"args": (a,)}) for a in
                [0, 1, 2**63, 2**63 - 1, 2**64 - 1, 2**64 - 2, 2**32 + 5] +
                [rng.randrange(2**64) for _ in range(400)] + [rng.randrange(5000) for _ in range(400)]]
    if name == "latency":  # entry and return alternate, each thread its own
        hits = []
        for i in range(300):
            hits += [("uprobe:./v:work", {"args": (i,), "tid": i % 3 + 1, "nsecs": 1000 * i}),
                     ("uretprobe:./v:work", {"tid": i % 3 + 1, "nsecs": 1000 * i + 7 * i})]
    theirs, ours, compiled = _both(PROGRAMS[name], hits)
    assert ours == theirs
    assert ours.count("\n") >= (1 if name == "printf" else 3)
    assert compiled.printed == compiled.evaluated_printed
    assert bool(compiled.printed) == (name in ("printf", "map_actions"))


# strings and checked pointer reads: hits pass good and unreadable addresses (arg0, arg2)
CHECKED_READS = """
    uprobe:./v:named { @w[str(arg0)] = count(); @short[str(arg0, 3)] = count();
        @is_beta[str(arg0) == "beta"] = count(); @who[comm, arg1 % 2] = count();
        @u32 = sum(*(uint32 *)arg2); @i16 = sum(*(int16 *)(arg2 + 4)); @i8 = min(*(int8 *)(arg2 + 6));
        @far = sum(*(uint64 *)(arg2 + 8)); }"""


def test_strings_and_pointer_reads_are_checked():
    words = [ctypes.create_string_buffer(w) for w in (b"alpha", b"beta", b"gamma" * 20)]
    record = ctypes.create_string_buffer(struct.pack("<IhbQ", 70000, -3, -1, 1 << 40), 16)
    here = [ctypes.addressof(w) for w in words]
    unreadable = 0x10
    text = CHECKED_READS
    hits = [("uprobe:./v:named", {"args": (here[i % 3] if i % 4 else unreadable, i,
                                             ctypes.addressof(record) if i % 5 else unreadable),
                                    "comm": "worker" if i % 2 else "main"})
            for i in range(60)]
    compiled = Compiled(text)
    state = State(compiled.checked)
    block = compiled.checked.program.blocks[0]

    def read(address, size):
        try:
            return ctypes.string_at(address, size) if address > 0x1000 else None
        except OSError:
            return None
    for probe, fields in hits:
        run_block(state, block, Hit(block.probes[0], read=read, **fields))
        compiled.hit(probe, **fields)
    ours = output.text(compiled.maps())
    assert ours == output.text(list(state.maps.values()))
    assert '@w[gammagammagammagammagammagammagammagammagammagammagammagammagam]' in ours
    assert "@w[]: 15" in ours and "@short[al]: 15" in ours and "@i8: -1" in ours
    # each read of a bad address is counted: 3 str() in 15 hits, 4 pointer reads in 12
    assert M.faults(compiled.area) == 3 * 15 + 4 * 12


# maps of strings: stored from str() (of good and unreadable addresses), read back into
# keys, comparisons, other maps and printf(), deleted
STRING_MAPS = """
    uprobe:./v:named { @last[arg1 % 3] = str(arg0); @two[arg1 % 2] = str(arg0, 3);
        @copy[arg1 % 4] = @last[(arg1 + 1) % 3]; @is[@last[0] == "alpha"] = count();
        @by[@copy[arg1 % 4]] = count(); if (arg1 == 41) { delete(@two[1]); }
        if (arg1 % 13 == 0) { printf("%s|\\n", @last[1]); } }"""


def test_maps_of_strings():
    words = [ctypes.create_string_buffer(w) for w in (b"alpha", b"beta", b"gamma" * 20)]
    here = [ctypes.addressof(w) for w in words]
    hits = [("uprobe:./v:named", {"args": (here[i % 3] if i % 4 else 0x10, i)})
            for i in range(60)]
    compiled = Compiled(STRING_MAPS)
    state = State(compiled.checked)
    block = compiled.checked.program.blocks[0]

    def read(address, size):
        return ctypes.string_at(address, size) if address > 0x1000 else None
    for probe, fields in hits:
        run_block(state, block, Hit(block.probes[0], read=read, comm="app", **fields))
        compiled.hit(probe, **fields)
    ours = output.text(compiled.maps())
    assert ours == output.text(list(state.maps.values()))
    assert compiled.printed == state.printed and len(compiled.printed) == 5
    assert "@last[2]: gammagamma" in ours and "@two[0]: be\n@two[1]: ga\n" in ours


def test_exit_ends_its_block_and_tells_the_tracer():
    """exit(): an event the tracer ends the run on; the rest of its block does not run,
    the other blocks of the hit do (bpftrace's: a program per block), as the
    evaluator has it. (The tracer stops the processes: tests/test_program_run.py.)"""
    text = """uprobe:./v:work /arg0 == 5/ { @b = count(); exit(); @a = count(); }
              uprobe:./v:work /arg0 <= 5/ { @all = count(); }"""
    hits = [("uprobe:./v:work", {"args": (i,)}) for i in range(8)]
    theirs, ours, compiled = _both(text, hits)
    assert ours == theirs and "@all: 6" in ours and "@b: 1" in ours and "@a: 1" not in ours
    assert compiled.exits == 1 and compiled.printed == []


def test_threads_count_exactly_and_a_full_table_says_so():
    compiled = Compiled("uprobe:./v:f { @ = count(); @k[arg0 % 8] = sum(arg0); @many[arg0] = count(); }")

    def run(first):
        for i in range(first, first + 3000):
            compiled.hit("uprobe:./v:f", args=(i,))
    threads = [threading.Thread(target=run, args=(k * 3000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    maps = {m.name: m for m in compiled.maps()}
    assert maps[""].entries == {(): 12000}
    assert sum(maps["k"].entries.values()) == sum(range(12000))
    assert len(maps["many"].entries) == M.KEYED_CAPACITY
    assert compiled.dropped == 12000 - M.KEYED_CAPACITY
