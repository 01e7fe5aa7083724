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

from probe_programs import (CHECKED_READS, FLOATS, PROGRAMS, STRING_MAPS, WORK, LookupProgram,
                            RandomProgram, float_hits, random_hits)
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
                what, number, top, div = action
                if what == "print":
                    name = self.lowered.maps[number].name
                    self.printed += [output.text([m], top, div) for m in self.maps()
                                     if m.name == name]
                else:
                    M.reset(self.area, self.lowered.maps, number, forget=what == "clear")
                return
            self.printed.append(printf_text(text, printf_values(kinds, list(
                (ctypes.c_uint64 * count).from_address(words)))))
        self.event = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)(event)

    def hit(self, probe: str, args=(), retval=0, tid=1, nsecs=0, comm="app", fargs=(),
            fretval=0):
        if probe not in self.functions:  # a probe the program does not name
            return
        context = ctypes.create_string_buffer(P.CTX_SIZE)
        args = (retval,) if probe.startswith("uretprobe") else args  # a return's one argument
        struct.pack_into(f"<{len(args)}Q", context, P.CTX_ARGS, *[a & (2**64 - 1) for a in args])
        struct.pack_into("<QQQQ", context, P.CTX_PID, os.getpid(), tid, nsecs, self.area_address)
        struct.pack_into("<Q", context, P.CTX_EVENT, ctypes.cast(self.event, ctypes.c_void_p).value)
        context[P.CTX_COMM:P.CTX_COMM + len(comm)] = comm.encode()
        # the floating-point registers as the probe finds them: passed as doubles, which
        # the calling convention puts in xmm0..7 (bit for bit: the words are their bits)
        words = (fretval,) if probe.startswith("uretprobe") else tuple(fargs)
        doubles = [struct.unpack("<d", struct.pack("<Q", w))[0] for w in (words + (0,) * 8)[:8]]
        call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, *[ctypes.c_double] * 8)(
            ctypes.cast(self.functions[probe], ctypes.c_void_p).value)
        call(ctypes.addressof(context), *doubles)

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


def test_floating_point_is_compared_and_converted_as_c_does():
    """farg0..7 and fretval read the registers (here: the doubles ctypes passes), and
    what a program does with them (comparisons with constants and with each other,
    conversion toward zero, (float) and (int32), keys, values and printf()) is integer
    code that must give what C gives, on every kind of value."""
    theirs, ours, compiled = _both(FLOATS, float_hits(400))
    assert ours == theirs
    assert compiled.printed == compiled.evaluated_printed and len(compiled.printed) > 50
    for shown in ("@big: ", "@cmp[0, 0, 1, 0]", "@key[", "@r[1, 0]", "@by[1]: inf", "@val: "):
        assert shown in ours


@pytest.mark.parametrize("seed", range(0, 400, 50))
def test_random_programs_compile_to_what_the_evaluator_does(seed):
    """50 random programs a seed (probe_programs.RandomProgram: every operator, width and
    sign, casts, ?:, short-circuits, variables, maps read back, aggregations with keys,
    if/else, printf, floating-point comparisons and conversions) on random hits: the
    compiled code's maps and printf() lines are the evaluator's."""
    for k in range(seed, seed + 50):
        text = RandomProgram(k).program()
        theirs, ours, compiled = _both(text, random_hits(k))
        assert ours == theirs, text
        assert compiled.printed == compiled.evaluated_printed, text


@pytest.mark.parametrize("seed", range(0, 300, 50))
def test_maps_looked_up_again_and_again_compile_to_what_the_evaluator_does(seed):
    """50 random programs a seed (probe_programs.LookupProgram) whose maps with keys are
    read, written and deleted by the same few keys again and again in a hit, in
    branches too: where programs/reuse.py keeps an entry it must be the one a lookup
    would find (one that kept it across an if's end crashed this process)."""
    for k in range(seed, seed + 50):
        text = LookupProgram(k).program()
        theirs, ours, compiled = _both(text, random_hits(k))
        assert ours == theirs, text
        assert compiled.printed == compiled.evaluated_printed, text


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


def test_probe_keys_are_words_and_read_back_as_names():
    """A map key that is `probe` wherever the program writes it (or `func` wherever) is
    a word (the index of the name, kept in the map's shape, in the area's own
    description too), not 64 bytes: the maps read back as the evaluator's; a key place
    that is anything else somewhere stays a string."""
    text = ("uprobe:./v:work { @[probe] = count(); @k[probe, arg0 % 3] = sum(arg0); "
            "@m[probe] = count(); @f[func] = count(); @pf[probe] = count(); } "
            "uprobe:./v:named { @[probe] = count(); @m[\"named\"] = count(); @x = @m[probe]; "
            "@f[func] = count(); @pf[func] = count(); }")
    hits = [("uprobe:./v:work", {"args": (i,)}) for i in range(40)] + \
           [("uprobe:./v:named", {"args": (0, i)}) for i in range(7)]
    theirs, ours, compiled = _both(text, hits)
    assert ours == theirs and "@[uprobe:./v:named]: 7\n" in ours and "@m[named]: 7" in ours
    kinds = {s.name: s.key_types for s in compiled.lowered.maps}
    assert kinds == {"": (M.NAME,), "k": (M.NAME, "int"), "m": ("string",), "x": (),
                     "f": (M.NAME,), "pf": ("string",)}
    named = {s.name: s.names for s in compiled.lowered.maps}
    assert {"uprobe:./v:work", "uprobe:./v:named"} <= set(named[""]) and named["m"] == ()
    # (a reader with only the file: `stat` of a built-in program, `top`, `export`)
    assert M.shapes_of(compiled.area) == compiled.lowered.maps


def test_a_probe_key_is_its_whole_name_however_long():
    """`@[probe]` prints the probe's whole name, as bpftrace does, past the 63 bytes a
    string key keeps."""
    path = "./" + "a_directory_whose_name_is_long/" * 3 + "v"
    text = f"uprobe:{path}:work {{ @[probe] = count(); }}"
    theirs, ours, _ = _both(text, [(f"uprobe:{path}:work", {"args": (i,)}) for i in range(3)])
    assert ours == theirs == f"@[uprobe:{path}:work]: 3\n"


def test_a_constant_keys_first_slot_is_worked_out_when_compiled():
    """`@[probe] = count()`: the key is a constant of the probe's code (its name's word),
    so the entry's inline check looks at an address worked out at compile time, the one
    the lookup claims for that key (maps.first_slot: the test above), with no multiply
    on the hit's way; the maps as the evaluator's (test_probe_keys_...)."""
    from urewrite.arch.x86_64 import program_code
    lowered = L.lower(check(parse("uprobe:./v:work { @[probe] = count(); } "
                                  "uprobe:./v:named { @[probe] = count(); }")))
    offsets, _ = M.layout(lowered.maps)
    text, labels = program_code.source(lowered, offsets)
    shape = lowered.maps[0]
    for word, probe in enumerate(lowered.code):  # (the names' words: 0, 1)
        start = text.index(labels[probe] + ":\n")
        body = text[start:text.index("ret\n", start)]
        slot = M.first_slot((word,), shape.capacity) * 8 * shape.entry_words
        assert f"lea rax, [r12 + {offsets[0] + 8 * M.HEADER_WORDS + slot}]" in body
        assert "imul" not in body


def test_the_latency_idiom_looks_its_start_up_once_a_return():
    """`/@start[tid]/ { ... nsecs - @start[tid] ... delete(@start[tid]) }`: one lookup, its
    entry kept for the other two (programs/reuse.py; what the maps hold is the
    evaluator's: test_compiled_maps_are_the_evaluators' "latency" and "lookups_again")."""
    lowered = L.lower(check(parse(PROGRAMS["latency"])))
    ops = lowered.code["uretprobe:./v:work"]
    assert [op[0] for op in ops].count("find") == 1
    assert [op[0] for op in ops].count("entry") == 2  # @ns, @left[tid]: maps of their own


def test_entries_are_where_the_inline_checks_look_for_them():
    """A map without keys is read at its table's first entry without the lookup's call
    where the entry's state says claimed (maps.entry_state of no words); a map keyed by
    one word is checked at the key's first slot (maps.first_slot) before the call: the
    lookup claims entries there, with that state, for no key words as for one."""
    compiled = Compiled("uprobe:./v:work { @n = count(); @k[arg0] = count(); @total = sum(@n); }")
    keys = (77, 3, 2**63 + 5, 1000)
    for i in range(5):
        for key in keys:
            compiled.hit("uprobe:./v:work", args=(key,))
    offsets, _ = M.layout(compiled.lowered.maps)
    shapes = {shape.name: (shape, at) for shape, at in zip(compiled.lowered.maps, offsets)}
    shape, at = shapes["n"]
    entry = at + 8 * M.HEADER_WORDS
    assert struct.unpack_from("<Q", compiled.area, entry)[0] == M.entry_state(())
    shape, at = shapes["k"]
    words = struct.unpack_from(f"<{shape.capacity * shape.entry_words}Q", compiled.area,
                               at + 8 * M.HEADER_WORDS)
    entries = [words[i:i + shape.entry_words] for i in range(0, len(words), shape.entry_words)]
    for key in keys:  # (no two of these share a first slot)
        state, present, stored, count = entries[M.first_slot((key,), shape.capacity)]
        assert (state, present, stored, count) == (M.entry_state((key,)), 1, key, 5)
    text = output.text(compiled.maps())
    assert "@n: 20\n" in text and "@total: 210\n" in text
