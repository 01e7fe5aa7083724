"""Compiled probe programs (arm64) build the maps the reference evaluator builds:
tests/test_program_code.py's programs and hits, the code run under qemu-aarch64.

A small arm64 program (HARNESS_C below) maps the code, the maps and a data page
at DATA, and calls the probes' functions with the contexts this test made, as the
runtime makes them (in threads, for the threads test); it writes the maps back,
and printf()'s events. The same hits go to the evaluator; the maps must print the
same, printf()'s lines too."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from conftest import check
from cross import CC, QEMU, SYSROOT, needs
from probe_programs import (CHECKED_READS, FLOATS, PROGRAMS, STRING_MAPS, WORK, LookupProgram,
                            RandomProgram, float_hits, random_hits)
from urewrite.programs import lower as L
from urewrite.programs import maps as M
from urewrite.programs import output
from urewrite.programs.checks import check as check_program
from urewrite.programs.evaluate import Hit, State, printf_text, run_block
from urewrite.programs.parser import parse
from urewrite.program_run import printf_values
from urewrite.trampolines import program_file as P

pytestmark = needs(CC, QEMU)

DATA = 0x70000000  # where the harness maps the test's data (strings, records)

HARNESS_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* input: u64 size + code, u64 size + maps area, u64 size + data (mapped at DATA),
   u64 threads, u64 hits, then per hit u64 function offset, CTX_SIZE bytes of
   context and 8 u64 of the floating-point argument registers (d0..d7); output: the maps area, then printf()s: u32 index, u32 words, the words */
static uint8_t *area;
static uint64_t hits, threads, *offsets;
static uint8_t *code, *contexts;
static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void event(uint32_t index, const uint64_t *words, uint64_t count) {
    uint32_t head[2] = {index, (uint32_t)count};
    pthread_mutex_lock(&lock);
    fwrite(head, 4, 2, out);
    fwrite(words, 8, count, out);
    pthread_mutex_unlock(&lock);
}

typedef void (*probe_code)(void *, double, double, double, double, double, double,
                           double, double);

static void *run(void *first) {
    for (uint64_t k = (uint64_t)first; k < hits; k += threads) {
        uint8_t context[CTX_SIZE];
        double d[8];  /* passed in d0..d7, as a probed function's arguments are */
        memcpy(context, contexts + k * HIT_SIZE, CTX_SIZE);
        memcpy(d, contexts + k * HIT_SIZE + CTX_SIZE, sizeof d);
        uint64_t pid = getpid(), maps = (uint64_t)area, routine = (uint64_t)event;
        memcpy(context + CTX_PID, &pid, 8);
        memcpy(context + CTX_MAPS, &maps, 8);
        memcpy(context + CTX_EVENT, &routine, 8);
        ((probe_code)(code + offsets[k]))(context, d[0], d[1], d[2], d[3], d[4], d[5], d[6],
                                          d[7]);
    }
    return NULL;
}

static uint8_t *part(FILE *in, uint64_t *size, void *at) {
    if (fread(size, 8, 1, in) != 1) exit(2);
    uint8_t *p = mmap(at, *size + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                      (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (p == MAP_FAILED || fread(p, 1, *size, in) != *size) exit(3);
    return p;
}

int main(int argc, char **argv) {
    FILE *in = fopen(argv[1], "rb");
    uint64_t code_size, area_size, data_size;
    code = part(in, &code_size, NULL);
    if (mprotect(code, code_size + 1, PROT_READ | PROT_EXEC)) return 4;
    area = part(in, &area_size, NULL);
    part(in, &data_size, (void *)DATA);
    if (fread(&threads, 8, 1, in) != 1 || fread(&hits, 8, 1, in) != 1) return 5;
    offsets = malloc(8 * hits + 8);
    contexts = malloc(HIT_SIZE * hits + 1);
    for (uint64_t k = 0; k < hits; k++)
        if (fread(offsets + k, 8, 1, in) != 1 || fread(contexts + k * HIT_SIZE, HIT_SIZE, 1, in) != 1)
            return 6;
    out = fopen(argv[2], "wb");
    fseek(out, area_size, SEEK_SET);
    pthread_t ids[64];
    for (uint64_t t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, run, (void *)t);
    for (uint64_t t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    fseek(out, 0, SEEK_SET);
    fwrite(area, 1, area_size, out);
    return fclose(out) != 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    work = tmp_path_factory.mktemp("arm64-code")
    source = work / "harness.c"
    defines = {"CTX_SIZE": P.CTX_SIZE, "HIT_SIZE": P.CTX_SIZE + 64, "CTX_PID": P.CTX_PID, "CTX_MAPS": P.CTX_MAPS,
               "CTX_EVENT": P.CTX_EVENT, "DATA": f"{DATA:#x}"}
    source.write_text("".join(f"#define {k} {v}\n" for k, v in defines.items()) + HARNESS_C)
    check([CC, "-O2", "-pthread", str(source), "-o", str(work / "harness")])
    return work / "harness"


def _compiled_run(harness: Path, text: str, hits, data: bytes = b"", threads: int = 1):
    """The maps and printf() lines of `text`'s arm64 code run on `hits` (probe text,
    Hit fields), and the fault count."""
    from urewrite.arch import EM_AARCH64, backend_for
    lowered = L.lower(check_program(parse(text)))
    offsets, _ = M.layout(lowered.maps)
    code, entries = backend_for(EM_AARCH64).program_code(lowered, offsets)
    area = bytes(M.initial_area(lowered.maps))
    blob = [struct.pack("<Q", len(code)), code, struct.pack("<Q", len(area)), area,
            struct.pack("<Q", len(data)), data]
    named = [(probe, fields) for probe, fields in hits if probe in entries]
    blob.append(struct.pack("<QQ", threads, len(named)))
    for probe, fields in named:
        args = (fields.get("retval", 0),) if probe.startswith("uretprobe") else fields.get("args", ())
        context = bytearray(P.CTX_SIZE)
        struct.pack_into(f"<{len(args)}Q", context, P.CTX_ARGS, *[a & (2**64 - 1) for a in args])
        struct.pack_into("<QQ", context, P.CTX_TID, fields.get("tid", 1), fields.get("nsecs", 0))
        comm = fields.get("comm", "app").encode()
        context[P.CTX_COMM:P.CTX_COMM + len(comm)] = comm
        registers = (fields.get("fretval", 0),) if probe.startswith("uretprobe") else \
            tuple(fields.get("fargs", ()))
        blob += [struct.pack("<Q", entries[probe]), bytes(context),
                 struct.pack("<8Q", *(registers + (0,) * 8)[:8])]
    work = harness.parent
    (work / "in").write_bytes(b"".join(blob))
    cmd = [QEMU] + (["-L", SYSROOT] if SYSROOT else []) + [str(harness), str(work / "in"),
                                                          str(work / "out")]
    subprocess.run(cmd, check=True, timeout=300)
    result = (work / "out").read_bytes()
    found, _ = M.read(result[:len(area)], lowered.maps)
    printed, at = [], len(area)
    while at < len(result):
        index, count = struct.unpack_from("<II", result, at)
        words = list(struct.unpack_from(f"<{count}Q", result, at + 8))
        at += 8 + 8 * count
        text_, kinds = lowered.printfs[index]
        printed.append(printf_text(text_, printf_values(kinds, words)))
    return output.text(found), printed, M.faults(result[:len(area)])


def _evaluated(text: str, hits, read=None):
    checked = check_program(parse(text))
    state = State(checked)
    for probe_text, fields in hits:
        for block in checked.program.blocks:
            for probe in block.probes:
                if probe.text == probe_text:
                    run_block(state, block, Hit(probe, read=read, **{"comm": "app", **fields}))
    return output.text(list(state.maps.values())), state.printed


def _latency_hits():
    hits = []
    for i in range(300):
        hits += [("uprobe:./v:work", {"args": (i,), "tid": i % 3 + 1, "nsecs": 1000 * i}),
                 ("uretprobe:./v:work", {"tid": i % 3 + 1, "nsecs": 1000 * i + 7 * i})]
    return hits


# (map_actions: the tracer does print(), clear() and zero() when it reads their event,
# between hits; this harness reads the events after them all. Their code is a printf()
# of no value, which "printf" has.)
@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - {"map_actions"}))
def test_compiled_maps_are_the_evaluators(harness, name):
    hits = _latency_hits() if name == "latency" else WORK
    ours, printed, faults = _compiled_run(harness, PROGRAMS[name], hits)
    theirs, evaluated = _evaluated(PROGRAMS[name], hits)
    assert ours == theirs
    assert ours.count("\n") >= (1 if name == "printf" else 3)
    assert printed == evaluated and bool(printed) == (name == "printf")
    assert faults == 0


def test_floating_point_is_compared_and_converted_as_c_does(harness):
    """farg0..7 and fretval read d0..d7, and what is done with them is the integer code
    x86_64 runs too (test_program_code.py's test of the same name): the same answers."""
    hits = float_hits(300)
    ours, printed, faults = _compiled_run(harness, FLOATS, hits)
    theirs, evaluated = _evaluated(FLOATS, hits)
    assert ours == theirs
    assert printed == evaluated and len(printed) > 50


@pytest.mark.parametrize("seed", range(0, 200, 25))
def test_random_programs_compile_to_what_the_evaluator_does(harness, seed):
    """test_program_code.py's random programs (25 a seed, other seeds), under qemu."""
    _held_to_the_evaluator(harness, RandomProgram, range(10000 + seed, 10000 + seed + 25))


@pytest.mark.parametrize("seed", range(0, 100, 25))
def test_maps_looked_up_again_and_again_compile_to_what_the_evaluator_does(harness, seed):
    """test_program_code.py's LookupProgram programs (25 a seed, other seeds), under qemu."""
    _held_to_the_evaluator(harness, LookupProgram, range(20000 + seed, 20000 + seed + 25))


def _held_to_the_evaluator(harness, generator, seeds) -> None:
    for k in seeds:
        text = generator(k).program()
        hits = random_hits(k)
        ours, printed, _ = _compiled_run(harness, text, hits)
        theirs, evaluated = _evaluated(text, hits)
        assert ours == theirs, text
        assert printed == evaluated, text


def test_strings_and_pointer_reads_are_checked(harness):
    """test_program_code's reads: strings (one past 64 bytes), a record read by type,
    and a bad address, each read of it counted."""
    words = [b"alpha\0", b"beta\0", b"gamma" * 20 + b"\0"]
    data = bytearray(b"".join(words)) + bytes(16)
    places = [0, len(words[0]), len(words[0]) + len(words[1])]
    record = len(data)
    data += struct.pack("<IhbQ", 70000, -3, -1, 1 << 40).ljust(16, b"\0")
    unreadable = 0x10
    text = CHECKED_READS
    hits = [("uprobe:./v:named", {"args": (DATA + places[i % 3] if i % 4 else unreadable, i,
                                           DATA + record if i % 5 else unreadable),
                                  "comm": "worker" if i % 2 else "main"})
            for i in range(60)]

    def read(address, size):
        if DATA <= address and address + size <= DATA + len(data):
            return bytes(data[address - DATA:address - DATA + size])
        if DATA <= address < DATA + len(data):  # (the page holds zeros past the data)
            return bytes(data[address - DATA:]).ljust(size, b"\0")
        return None
    ours, _, faults = _compiled_run(harness, text, hits, bytes(data))
    theirs, _ = _evaluated(text, hits, read)
    assert ours == theirs
    assert '@w[gammagammagammagammagammagammagammagammagammagammagammagammagam]' in ours
    assert "@w[]: 15" in ours and "@short[al]: 15" in ours and "@i8: -1" in ours
    assert faults == 3 * 15 + 4 * 12


def test_maps_of_strings(harness):
    """test_program_code's maps of strings: stored, read back, compared, printed."""
    words = [b"alpha\0", b"beta\0", b"gamma" * 20 + b"\0"]
    data = bytearray(b"".join(words)) + bytes(16)
    places = [0, len(words[0]), len(words[0]) + len(words[1])]
    hits = [("uprobe:./v:named", {"args": (DATA + places[i % 3] if i % 4 else 0x10, i)})
            for i in range(60)]

    def read(address, size):
        if DATA <= address < DATA + len(data):
            return bytes(data[address - DATA:address - DATA + size]).ljust(size, b"\0")
        return None
    ours, printed, _ = _compiled_run(harness, STRING_MAPS, hits, bytes(data))
    theirs, evaluated = _evaluated(STRING_MAPS, hits, read)
    assert ours == theirs and printed == evaluated and len(printed) == 5
    assert "@two[0]: be\n@two[1]: ga\n" in ours


def test_threads_count_exactly_and_a_full_table_says_so(harness):
    """Four threads at once: exclusive pairs lose no update, claims no key."""
    text = "uprobe:./v:f { @ = count(); @k[arg0 % 8] = sum(arg0); @many[arg0] = count(); }"
    hits = [("uprobe:./v:f", {"args": (i,)}) for i in range(12000)]
    ours, _, _ = _compiled_run(harness, text, hits, threads=4)
    lines = ours.splitlines()
    assert "@: 12000" in lines
    assert sum(int(line.split(": ")[1]) for line in lines if line.startswith("@k[")) == \
        sum(range(12000))
    assert sum(1 for line in lines if line.startswith("@many[")) == M.KEYED_CAPACITY
