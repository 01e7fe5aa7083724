/* urewrite.h: read the shared-memory regions that urewrite probes count into.
 *
 * SPDX-License-Identifier: MIT
 *
 * Copyright (c) the urewrite authors
 *
 * Permission is hereby granted, free of charge, to any person obtaining a copy
 * of this software and associated documentation files (the "Software"), to deal
 * in the Software without restriction, including without limitation the rights
 * to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 * copies of the Software, and to permit persons to whom the Software is
 * furnished to do so, subject to the following conditions:
 *
 * The above copyright notice and this permission notice shall be included in
 * all copies or substantial portions of the Software.
 *
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 * IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 * FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 * AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 * LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
 * OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 * SOFTWARE.
 *
 * A rewritten program writes one region file per process and rewritten object,
 * <tag>.<pid>[-N].ure in the directory named by $UREWRITE_DIR. The layout
 * (trampolines/region.py is its source of truth; docs/region.md explains it):
 *
 *     header          512 bytes, struct urewrite_header
 *     probe table     probe_count x struct urewrite_probe
 *     names           NUL-terminated strings
 *     owner table     slot_count x struct urewrite_slot_owner
 *     thread names    slot_count x 16 bytes (runtime state: the owners' comm)
 *     counters        (slot_count + 1) rows of slot_stride bytes, one uint64_t
 *                     per probe; the last row is shared by every thread
 *
 * Usage: map the file (read-only is enough), call urewrite_check() once, then
 * use the other helpers. They trust the header only after that check passed.
 */
#ifndef UREWRITE_H
#define UREWRITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Fields are little-endian and are read in place, so a big-endian reader
 * would need to byte-swap them; regions are only written on x86_64. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "urewrite.h reads little-endian fields in place; this host is not little-endian"
#endif

#define UREWRITE_MAGIC "UREWRITE" /* the first 8 bytes, no NUL */
#define UREWRITE_MAGIC_SIZE 8
#define UREWRITE_VERSION 2
#define UREWRITE_HEADER_SIZE 512
#define UREWRITE_BUILD_ID_MAX 32
#define UREWRITE_OBJECT_MAX 256 /* object name, NUL included */
#define UREWRITE_ENV_VAR "UREWRITE_DIR"
/* set to 1 (beside UREWRITE_DIR): calls of functions probed at entry and return are
   timed into their latency histograms; unset, they are only counted */
#define UREWRITE_LATENCY_ENV_VAR "UREWRITE_LATENCY"
#define UREWRITE_FILE_SUFFIX ".ure"

/* urewrite_probe.kind */
#define UREWRITE_KIND_ENTRY 1   /* a function's first instruction */
#define UREWRITE_KIND_RETURN 2  /* a function's return */
#define UREWRITE_KIND_USDT 3    /* a USDT (SystemTap SDT) probe point */
#define UREWRITE_KIND_ADDRESS 4 /* an instruction inside a function */

/* urewrite_check() results */
#define UREWRITE_OK 0
#define UREWRITE_ERR_SIZE (-1)    /* shorter than a header or than region_size */
#define UREWRITE_ERR_MAGIC (-2)   /* not a region (or not yet filled in) */
#define UREWRITE_ERR_VERSION (-3) /* a layout this header does not know */
#define UREWRITE_ERR_BOUNDS (-4)  /* a table, row or name lies outside the region */

struct urewrite_header {
    char magic[8];             /* UREWRITE_MAGIC */
    uint32_t version;          /* UREWRITE_VERSION */
    uint32_t header_size;      /* 512: the header with its reserved tail */
    uint64_t region_size;      /* bytes in use, a multiple of 4096 */
    uint32_t probe_count;
    uint32_t slot_count;       /* per-thread counter rows (256) */
    uint64_t probes_offset;    /* from the start of the region, like all offsets */
    uint64_t strings_offset;   /* base of urewrite_probe.name_offset */
    uint64_t owners_offset;
    uint64_t counters_offset;
    uint64_t slot_stride;      /* bytes per counter row, a multiple of 64 */
    int32_t pid;               /* of the process that wrote the region */
    uint32_t machine;          /* ELF e_machine of the object (62 = x86_64) */
    int64_t load_bias;         /* run-time address minus link-time address */
    uint32_t build_id_size;    /* bytes used in build_id; 0 when none */
    uint32_t flags;            /* UREWRITE_FLAG_* */
    uint8_t build_id[32];      /* GNU build ID of the original object */
    char object[256];          /* file name of the rewritten object, NUL-terminated */
    /* version 2: the event ring, present under `urewrite trace` (ring_offset 0: none) */
    uint64_t ring_offset;      /* struct urewrite_ring, then ring_entries records */
    uint32_t ring_entries;     /* a power of two */
    uint32_t record_size;      /* sizeof(struct urewrite_record) */
    uint64_t clock_ref_ticks;  /* ticks and CLOCK_MONOTONIC ns read together at set-up */
    uint64_t clock_ref_ns;
    uint64_t clock_hz;         /* ticks per second; ns = ref_ns + (t - ref_ticks) * 1e9 / hz */
    uint32_t clock_kind;       /* UREWRITE_CLOCK_* */
    uint32_t latency_count;    /* latency histograms per row (entry+return probed functions) */
    uint64_t ns_mult;          /* ns per clock tick, 32.32 fixed point */
    uint64_t returns_missed;   /* calls whose return address could not be redirected */
    uint64_t latency_missed;   /* returns of latency-measured functions without a sample */
    uint64_t go_calls_offset;  /* a Go program's open calls by goroutine (runtime state); 0 none */
    uint32_t go_call_count;    /* entries of 32 bytes there */
    uint8_t reserved[44];      /* zero; later compatible fields go here */
};

/* Latency: in every counter row, after probe_count counters, latency_count
 * histograms of UREWRITE_LATENCY_BUCKETS uint64_t (bucket 0: under 1 ns; bucket k:
 * [2^(k-1), 2^k) ns), then the owner thread's stack of open calls. A return
 * probe with a histogram has (histogram index + 1) in bits 16-31 of its kind.
 * Bits 8-15 hold 1 + the values the probe's events carry (0: not said). */
#define UREWRITE_LATENCY_BUCKETS 64
/* header flags: calls were timed (latency asked for); without it (and with
   UREWRITE_FLAG_LATENCY_ASKED) the histograms and latency_missed stay zero */
#define UREWRITE_FLAG_LATENCY 1
/* header flags, set by the rewrite: the runtime sets UREWRITE_FLAG_LATENCY only when
   asked; a region with neither flag (a file rewritten before) had every call timed */
#define UREWRITE_FLAG_LATENCY_ASKED 2
#define UREWRITE_KIND_MASK 0xff

#define UREWRITE_CLOCK_TSC 1    /* x86_64 rdtsc */
#define UREWRITE_CLOCK_CNTVCT 2 /* AArch64 cntvct_el0 */

/* The ring's control line. Writers take a position with an atomic add on head;
 * `dropped` counts events a writer gave up because its record was busy. */
struct urewrite_ring {
    uint64_t head;
    uint64_t dropped;
    uint8_t reserved[48];
};

/* Record `pos` lives at index pos % ring_entries. Its sequence is 2*pos+1 while
 * being written and 2*pos+2 when complete: read it before and after copying
 * the record, and keep the copy only if both read 2*pos+2. */
struct urewrite_record {
    uint64_t sequence;
    uint64_t ticks;
    uint32_t probe;       /* index in the probe table */
    uint32_t tid;         /* kernel thread id; 0 for threads in the shared row */
    uint32_t arg_count;
    uint32_t reserved;
    int64_t args[6];
    uint8_t pad[48];
};

struct urewrite_probe {
    uint64_t address;     /* link-time address; add load_bias for the run-time one */
    uint32_t kind;        /* UREWRITE_KIND_* in the low byte; bits 8-15: 1 + its
                             events' values (0: not said); bits 16-31: histogram + 1 */
    uint32_t name_offset; /* from strings_offset */
};

struct urewrite_slot_owner {
    uint64_t thread;   /* thread pointer (x86_64 fs:[0], AArch64 tpidr_el0) of the
                          row's owner, 0 = free */
    uint64_t counters; /* the row's address in the writer's address space: use
                          counters_offset + slot * slot_stride instead */
    uint32_t tid;      /* the owner's kernel thread id, once an event or a probe
                          program needed it; else 0 */
    int32_t tid_at;    /* runtime state: where its libc keeps the id, as an offset
                          from the thread pointer; 0 when unknown */
    uint64_t reserved;
};

/* The layout is fixed by offsets, not by a compiler: fail the build if this
 * compiler lays the structs out differently. _Static_assert is C11; GCC and
 * Clang accept it in C99 mode too (__extension__ keeps -pedantic quiet). */
#if defined(__GNUC__)
#define UREWRITE_EXTENSION_ __extension__
#else
#define UREWRITE_EXTENSION_
#endif
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#define UREWRITE_UNDEF_STATIC_ASSERT_
#endif

UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, magic) == 0, "magic");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, version) == 8, "version");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, header_size) == 12, "header_size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, region_size) == 16, "region_size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, probe_count) == 24, "probe_count");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, slot_count) == 28, "slot_count");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, probes_offset) == 32, "probes_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, strings_offset) == 40, "strings_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, owners_offset) == 48, "owners_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, counters_offset) == 56, "counters_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, slot_stride) == 64, "slot_stride");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, pid) == 72, "pid");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, machine) == 76, "machine");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, load_bias) == 80, "load_bias");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, build_id_size) == 88, "build_id_size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, flags) == 92, "flags");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, build_id) == 96, "build_id");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, object) == 128, "object");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, ring_offset) == 384, "ring_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, ring_entries) == 392, "ring_entries");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, record_size) == 396, "record_size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, clock_ref_ticks) == 400, "clock_ref_ticks");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, clock_ref_ns) == 408, "clock_ref_ns");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, clock_hz) == 416, "clock_hz");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, clock_kind) == 424, "clock_kind");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, latency_count) == 428, "latency_count");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, ns_mult) == 432, "ns_mult");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, returns_missed) == 440, "returns_missed");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, latency_missed) == 448, "latency_missed");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, go_calls_offset) == 456, "go_calls_offset");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, go_call_count) == 464, "go_call_count");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_header, reserved) == 468, "reserved");
UREWRITE_EXTENSION_ _Static_assert(sizeof(struct urewrite_ring) == 64, "ring control size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_record, ticks) == 8, "record ticks");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_record, probe) == 16, "record probe");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_record, tid) == 20, "record tid");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_record, arg_count) == 24, "record arg_count");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_record, args) == 32, "record args");
UREWRITE_EXTENSION_ _Static_assert(sizeof(struct urewrite_record) == 128, "record size");
UREWRITE_EXTENSION_ _Static_assert(sizeof(struct urewrite_header) == UREWRITE_HEADER_SIZE, "header size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_probe, address) == 0, "probe address");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_probe, kind) == 8, "probe kind");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_probe, name_offset) == 12, "probe name_offset");
UREWRITE_EXTENSION_ _Static_assert(sizeof(struct urewrite_probe) == 16, "probe size");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_slot_owner, thread) == 0, "owner thread");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_slot_owner, counters) == 8, "owner counters");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_slot_owner, tid) == 16, "owner tid");
UREWRITE_EXTENSION_ _Static_assert(offsetof(struct urewrite_slot_owner, tid_at) == 20, "owner tid_at");
UREWRITE_EXTENSION_ _Static_assert(sizeof(struct urewrite_slot_owner) == 32, "owner size");

#ifdef UREWRITE_UNDEF_STATIC_ASSERT_
#undef _Static_assert
#undef UREWRITE_UNDEF_STATIC_ASSERT_
#endif

/* Whether `count` items of `each` bytes from `offset` end by `end`, without
 * overflowing: the header comes from a file and may be anything. */
static inline int urewrite_span_ok_(uint64_t offset, uint64_t count, uint64_t each,
                                    uint64_t end)
{
    return offset <= end && (each == 0 || count <= (end - offset) / each);
}

/* UREWRITE_OK when `size` bytes at `base` hold a region this header can read
 * safely: magic, version, and every table, counter row and name inside
 * region_size (itself within `size`). `base` must be 8-byte aligned (an mmap
 * is). Returns a UREWRITE_ERR_* value otherwise. While the writer is still
 * setting a region up, a reader may get UREWRITE_ERR_MAGIC: retry later. */
static inline int urewrite_check(const void *base, size_t size)
{
    const struct urewrite_header *h = (const struct urewrite_header *)base;
    const char *bytes = (const char *)base;
    uint64_t end, i;

    if (base == NULL || size < sizeof *h)
        return UREWRITE_ERR_SIZE;
    if (memcmp(h->magic, UREWRITE_MAGIC, UREWRITE_MAGIC_SIZE) != 0)
        return UREWRITE_ERR_MAGIC;
    if (h->version != UREWRITE_VERSION)
        return UREWRITE_ERR_VERSION;
    end = h->region_size;
    if (end > (uint64_t)size || end < sizeof *h)
        return UREWRITE_ERR_SIZE;
    if (h->header_size < offsetof(struct urewrite_header, reserved) || h->header_size > end)
        return UREWRITE_ERR_BOUNDS;
    /* tables and counters are read in place, so they must be aligned */
    if ((h->probes_offset | h->owners_offset | h->counters_offset | h->slot_stride) & 7)
        return UREWRITE_ERR_BOUNDS;
    if (h->build_id_size > UREWRITE_BUILD_ID_MAX ||
        memchr(h->object, 0, sizeof h->object) == NULL)
        return UREWRITE_ERR_BOUNDS;
    if (!urewrite_span_ok_(h->probes_offset, h->probe_count,
                           sizeof(struct urewrite_probe), end) ||
        !urewrite_span_ok_(h->owners_offset, h->slot_count,
                           sizeof(struct urewrite_slot_owner), end) ||
        h->slot_stride / 8 < h->probe_count ||
        !urewrite_span_ok_(h->counters_offset, (uint64_t)h->slot_count + 1, h->slot_stride,
                           end) ||
        h->strings_offset > end)
        return UREWRITE_ERR_BOUNDS;
    /* every name starts inside the region and ends there with a NUL */
    for (i = 0; i < h->probe_count; i++) {
        const struct urewrite_probe *p =
            (const struct urewrite_probe *)(bytes + h->probes_offset) + i;
        uint64_t start = h->strings_offset + p->name_offset;
        if (start >= end || memchr(bytes + start, 0, (size_t)(end - start)) == NULL)
            return UREWRITE_ERR_BOUNDS;
    }
    return UREWRITE_OK;
}

static inline const char *urewrite_check_message(int result)
{
    switch (result) {
    case UREWRITE_OK: return "ok";
    case UREWRITE_ERR_SIZE: return "truncated or too small";
    case UREWRITE_ERR_MAGIC: return "not a urewrite region";
    case UREWRITE_ERR_VERSION: return "unknown region version";
    case UREWRITE_ERR_BOUNDS: return "corrupt region (out of bounds)";
    default: return "unknown error";
    }
}

/* "entry", "return", "usdt", "address", or NULL for a kind added later. */
static inline const char *urewrite_kind_name(uint32_t kind)
{
    switch (kind & UREWRITE_KIND_MASK) { /* the high bits name a latency histogram */
    case UREWRITE_KIND_ENTRY: return "entry";
    case UREWRITE_KIND_RETURN: return "return";
    case UREWRITE_KIND_USDT: return "usdt";
    case UREWRITE_KIND_ADDRESS: return "address";
    default: return NULL;
    }
}

/* Probe i (i < probe_count) of a checked region. */
static inline const struct urewrite_probe *urewrite_probe_at(const struct urewrite_header *hdr,
                                                             uint32_t i)
{
    return (const struct urewrite_probe *)((const char *)hdr + hdr->probes_offset) + i;
}

/* Probe i's name, NUL-terminated inside the region (urewrite_check made sure). */
static inline const char *urewrite_probe_name(const struct urewrite_header *hdr, uint32_t i)
{
    return (const char *)hdr + hdr->strings_offset + urewrite_probe_at(hdr, i)->name_offset;
}

/* Probe i's hits: its column summed over the slot_count per-thread rows and
 * the shared row after them. The writer may still be counting, so each load
 * is volatile (read from memory every time, never cached); an aligned 8-byte
 * load is not torn on x86_64, but the sum is only a snapshot until the
 * process has exited. */
static inline uint64_t urewrite_hits(const struct urewrite_header *hdr, uint32_t i)
{
    const char *row = (const char *)hdr + hdr->counters_offset;
    uint64_t sum = 0, slot;

    for (slot = 0; slot <= hdr->slot_count; slot++, row += hdr->slot_stride)
        sum += ((const volatile uint64_t *)row)[i];
    return sum;
}

/* ---- C callbacks -------------------------------------------------------------
 *
 * `urewrite IN -p ... --call FILE.c:FUNCTION -o OUT` (built into the probes) and
 * `urewrite run --call FILE.c:FUNCTION -- COMMAND` run FUNCTION at every probe of
 * the file, armed, as
 *
 *     void FUNCTION(struct urewrite_context *ctx);
 *
 * It runs freestanding on the probed thread's stack, between the probed code's
 * instructions: no C library (no errno, malloc, printf, locks), no floating-point
 * or vector registers (it is compiled with -mgeneral-regs-only: the probe saves
 * the general registers only), no writable globals (its code is mapped read and
 * execute: keep state in maps or in ctx->area), a stack of at most
 * UREWRITE_CALLBACK_STACK bytes, and it must return soon. urewrite compiles FILE.c
 * with the machine's C compiler and checks what it can (docs/programs.md, "C
 * callbacks"); it cannot check what the code does with memory: read other memory
 * with urewrite_read() only. The helpers below are all it needs. */

#define UREWRITE_CALLBACK_STACK 2048
#define UREWRITE_CONTEXT_ARGS 12

struct urewrite_context {
    uint64_t args[UREWRITE_CONTEXT_ARGS]; /* the probe's arguments, as its file records
                                           * them (--args N, a USDT note's); a return
                                           * probe's args[0]: the return value */
    uint64_t pid;
    uint64_t tid;    /* UREWRITE_READS(UREWRITE_READS_TID), else 0 */
    uint64_t nsecs;  /* CLOCK_MONOTONIC, UREWRITE_READS(UREWRITE_READS_NSECS), else 0 */
    void *maps;      /* the maps file: the maps' tables, then the probes' areas */
    char comm[64];   /* the process's name, UREWRITE_READS(UREWRITE_READS_COMM) */
    void (*event)(uint32_t index, const uint64_t *words, uint64_t count);
    uint32_t probe;  /* the probe's number in its object (its region's probe table) */
    uint32_t kind;   /* UREWRITE_KIND_* */
    const char *name; /* the probe's name, as `urewrite list` shows it */
    uint64_t *area;  /* the probe's own --call-area bytes (64 by default), zeroed at
                      * the start, shared by the process's threads */
};

#define urewrite_retval(ctx) ((ctx)->args[0])

/* What a callback reads of its context beyond pid, probe, kind, name and area (the
 * rest is filled in only if it says so: a clock read, a thread lookup or an argument
 * costs nanoseconds a hit), e.g. UREWRITE_READS(UREWRITE_READS_TID | UREWRITE_ARGS(2)):
 * its thread id and args[0], args[1] (0 where a probe records no such argument; the
 * others are not filled in: they hold whatever the stack held). Without UREWRITE_READS,
 * all of it; without UREWRITE_ARGS, every argument (0 past those the probes record).
 * urewrite also reads the callback's code: a field it cannot read through its
 * ctx pointer is not filled in either (docs/programs.md, "C callbacks"). */
#define UREWRITE_READS_NSECS 1
#define UREWRITE_READS_TID 2
#define UREWRITE_READS_COMM 4
#define UREWRITE_ARGS(n) ((uint64_t)((n) + 1) << 8)
#define UREWRITE_READS(flags)                                                          \
    static const uint64_t urewrite_reads_                                              \
        __attribute__((section(".urewrite_reads"), used)) = (flags)

/* Maps that the tracer prints as bpftrace prints a program's (`urewrite run`, `stat`,
 * `top`, `export`): declare each at file scope, then update it with
 * urewrite_map_add(). An lhist takes its range: UREWRITE_LHIST_MAP(name, keys, low,
 * high, step). Keys are integers, at most UREWRITE_MAP_KEYS of them. */
#define UREWRITE_COUNT 1 /* @name[k] = count()      (the value is not used) */
#define UREWRITE_SUM 2   /* @name[k] = sum(value) */
#define UREWRITE_MIN 3
#define UREWRITE_MAX 4
#define UREWRITE_AVG 5
#define UREWRITE_HIST 6  /* log2 buckets, as bpftrace's hist() */
#define UREWRITE_LHIST 7 /* linear buckets, as lhist() */
#define UREWRITE_MAP_KEYS 4
#define UREWRITE_MAP_MAGIC 0x3150414d45525531ULL /* "1UREMAP1" */

struct urewrite_map {
    uint64_t magic;      /* UREWRITE_MAP_MAGIC: the rest is urewrite's to fill in */
    uint32_t kind, keys;
    int64_t low, high, step; /* an lhist's */
    char name[32];
    /* written by urewrite when it builds the callback, after compiling (read with
     * volatile loads, never folded into the code); the rest is folded: */
    uint64_t table;      /* the table's offset in the maps file */
    uint64_t capacity;   /* entries, a power of two */
    uint64_t entry_words;
};

#define UREWRITE_MAP_DECLARE_(name, kind, keys, low, high, step)                       \
    static const struct urewrite_map name                                              \
        __attribute__((section(".urewrite_maps"), used, aligned(8))) =                 \
        {UREWRITE_MAP_MAGIC, (kind), (keys), (low), (high), (step), #name, 0, 0, 0}
#define UREWRITE_MAP(name, kind, keys) UREWRITE_MAP_DECLARE_(name, kind, keys, 0, 0, 0)
#define UREWRITE_LHIST_MAP(name, keys, low, high, step)                                \
    UREWRITE_MAP_DECLARE_(name, UREWRITE_LHIST, keys, low, high, step)

#if defined(__x86_64__) || defined(__aarch64__)

static inline uint64_t urewrite_field_(const volatile uint64_t *field)
{
    return *field;
}

static inline void urewrite_pause_(void)
{
#if defined(__x86_64__)
    __asm__ volatile("pause");
#else
    __asm__ volatile("yield");
#endif
}

/* The entry of `keys` in `map`, claimed if missing; 0 when the table is full (the
 * update is counted as dropped). The protocol of programs/maps.py. */
static inline uint64_t *urewrite_map_entry_(const struct urewrite_context *ctx,
                                            const struct urewrite_map *map, const uint64_t *keys)
{
    const uint64_t mult = 0x9E3779B97F4A7C15ULL;
    uint64_t *table = (uint64_t *)((char *)ctx->maps + urewrite_field_(&map->table));
    uint64_t capacity = urewrite_field_(&map->capacity);
    uint64_t words = urewrite_field_(&map->entry_words);
    uint32_t nkeys = map->keys, i;
    uint64_t hash = mult, slot, left;

    for (i = 0; i < nkeys; i++)
        hash = (hash ^ keys[i]) * mult;
    hash = (hash ^ (hash >> 29)) | 1;
    for (slot = hash & (capacity - 1), left = capacity; left; left--,
         slot = (slot + 1) & (capacity - 1)) {
        uint64_t *entry = table + 8 + slot * words;
        for (;;) {
            uint64_t state = __atomic_load_n(&entry[0], __ATOMIC_ACQUIRE), free_ = 0;
            if (state == hash) {
                for (i = 0; i < nkeys && entry[2 + i] == keys[i]; i++)
                    ;
                if (i == nkeys)
                    return entry;
                break;
            }
            if (state == 2) { /* being claimed: its key comes next */
                urewrite_pause_();
                continue;
            }
            if (state != 0)
                break;
            if (!__atomic_compare_exchange_n(&entry[0], &free_, 2, 0, __ATOMIC_ACQUIRE,
                                             __ATOMIC_ACQUIRE))
                continue;
            for (i = 0; i < nkeys; i++)
                entry[2 + i] = keys[i];
            if (map->kind == UREWRITE_MIN)
                entry[2 + nkeys] = 0x7fffffffffffffffULL;
            else if (map->kind == UREWRITE_MAX)
                entry[2 + nkeys] = 0x8000000000000000ULL;
            __atomic_store_n(&entry[0], hash, __ATOMIC_RELEASE);
            return entry;
        }
    }
    __atomic_fetch_add(&table[4], 1, __ATOMIC_RELAXED); /* dropped */
    return 0;
}

/* Adds `value` to the entry of `keys` (its map's `keys` words) as the map's kind
 * says: count() ignores it. */
static inline void urewrite_map_update(const struct urewrite_context *ctx,
                                       const struct urewrite_map *map, const uint64_t *keys,
                                       int64_t value)
{
    uint64_t *entry = urewrite_map_entry_(ctx, map, keys);
    uint64_t *v, old, bucket;

    if (entry == 0)
        return;
    v = entry + 2 + map->keys;
    switch (map->kind) {
    case UREWRITE_COUNT:
        __atomic_fetch_add(v, 1, __ATOMIC_RELAXED);
        break;
    case UREWRITE_SUM:
        __atomic_fetch_add(v, (uint64_t)value, __ATOMIC_RELAXED);
        break;
    case UREWRITE_AVG:
        __atomic_fetch_add(&v[0], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&v[1], (uint64_t)value, __ATOMIC_RELAXED);
        break;
    case UREWRITE_MIN:
    case UREWRITE_MAX:
        old = __atomic_load_n(v, __ATOMIC_RELAXED);
        while (map->kind == UREWRITE_MIN ? value < (int64_t)old : value > (int64_t)old)
            if (__atomic_compare_exchange_n(v, &old, (uint64_t)value, 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                break;
        break;
    case UREWRITE_HIST: /* 0: negative, 1: zero, 2 + n: [2^n, 2^(n+1)) */
        bucket = value < 0 ? 0 : value == 0 ? 1 : 65 - (uint64_t)__builtin_clzll((uint64_t)value);
        __atomic_fetch_add(&v[bucket], 1, __ATOMIC_RELAXED);
        break;
    case UREWRITE_LHIST:
        if (value < map->low)
            bucket = 0;
        else if (value >= map->high)
            bucket = (uint64_t)((map->high - map->low) / map->step) + 1;
        else
            bucket = (uint64_t)((value - map->low) / map->step) + 1;
        __atomic_fetch_add(&v[bucket], 1, __ATOMIC_RELAXED);
        break;
    default:
        return;
    }
    __atomic_store_n(&entry[1], 1, __ATOMIC_RELEASE); /* present */
}

/* The same, for a map of one key (or none: the key is not used). */
static inline void urewrite_map_add(const struct urewrite_context *ctx,
                                    const struct urewrite_map *map, uint64_t key, int64_t value)
{
    urewrite_map_update(ctx, map, &key, value);
}

/* An event in the process's ring: `count` words (at most UREWRITE_CONTEXT_ARGS), which
 * `urewrite run` prints as one line. */
static inline void urewrite_emit(const struct urewrite_context *ctx, const uint64_t *words,
                                 uint64_t count)
{
    ctx->event(0, words, count);
}

static inline long urewrite_syscall_(long n, long a, long b, long c, long d, long e, long f)
{
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall" : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
#endif
}

#if defined(__x86_64__)
#define UREWRITE_SYS_READ_ 0
#define UREWRITE_SYS_WRITE_ 1
#define UREWRITE_SYS_CLOSE_ 3
#define UREWRITE_SYS_PIPE2_ 293
#define UREWRITE_SYS_VM_READV_ 310
#else
#define UREWRITE_SYS_READ_ 63
#define UREWRITE_SYS_WRITE_ 64
#define UREWRITE_SYS_CLOSE_ 57
#define UREWRITE_SYS_PIPE2_ 59
#define UREWRITE_SYS_VM_READV_ 270
#endif

/* Copies `size` bytes (at most 4096) from `address` in the process to `to`: 0; or
 * -1 when they are not all readable (NULL, unmapped, a guard page), `to` zeroed and
 * the fault counted (`run` reports them). Never a signal, never a changed errno:
 * process_vm_readv on the process itself, one system call (a pipe's five where the
 * kernel has none, as under qemu-user). */
static inline int urewrite_read(const struct urewrite_context *ctx, void *to,
                                uint64_t address, uint64_t size)
{
    struct { void *base; uint64_t len; } local = {to, size}, remote = {(void *)address, size};
    long got;
    int fds[2];
    uint64_t i;

    if (size > 4096)
        goto fault;
    got = urewrite_syscall_(UREWRITE_SYS_VM_READV_, (long)ctx->pid, (long)&local, 1,
                            (long)&remote, 1, 0);
    if (got == -38 && urewrite_syscall_(UREWRITE_SYS_PIPE2_, (long)fds, 02000000, 0, 0, 0,
                                        0) == 0) { /* ENOSYS; O_CLOEXEC */
        got = urewrite_syscall_(UREWRITE_SYS_WRITE_, fds[1], (long)address, (long)size, 0,
                                0, 0);
        if (got == (long)size)
            got = urewrite_syscall_(UREWRITE_SYS_READ_, fds[0], (long)to, (long)size, 0, 0,
                                    0);
        urewrite_syscall_(UREWRITE_SYS_CLOSE_, fds[0], 0, 0, 0, 0, 0);
        urewrite_syscall_(UREWRITE_SYS_CLOSE_, fds[1], 0, 0, 0, 0, 0);
    }
    if (got == (long)size)
        return 0;
fault:
    for (i = 0; i < size; i++)
        ((volatile char *)to)[i] = 0;
    __atomic_fetch_add((uint64_t *)((char *)ctx->maps + 16), 1, __ATOMIC_RELAXED);
    return -1;
}

#endif /* x86_64, aarch64 */

#endif /* UREWRITE_H */
