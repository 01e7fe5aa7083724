/* USDT sample: probes with 0 to 6 arguments of mixed sizes and signs, in loops
 * and branches, one with a semaphore, one name at several sites.
 *
 *   usdt [ROUNDS]     (default 40)
 *
 * For every probe it fires, it prints "fire PROBE ARGS..." with the values it
 * passed, so a test can compare them with what `urewrite trace` recorded. The
 * "guarded" probe fires only while its semaphore says someone listens. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

/* with _SDT_HAS_SEMAPHORES every probe of this file has one; only "guarded" checks it
 * (samples/usdt_threads.c has probes without) */
#define SEMAPHORE(name) unsigned short sample_##name##_semaphore \
    __attribute__((unused, section(".probes")))
SEMAPHORE(guarded);
SEMAPHORE(six);
SEMAPHORE(third);
SEMAPHORE(zero);
SEMAPHORE(pair);
SEMAPHORE(edge);
#define SAMPLE_GUARDED_ENABLED() __builtin_expect(sample_guarded_semaphore, 0)

static long total;

__attribute__((noinline)) static long expensive(int i) {
    total += i;
    return (long)i * 1000003;
}

__attribute__((noinline)) int step(int i, long big, short s, signed char c, unsigned char u,
                                   unsigned int w) {
    DTRACE_PROBE6(sample, six, i, big, s, c, u, w);
    printf("fire six %d %ld %d %d %u %u\n", i, big, s, c, u, w);
    if (i % 3 == 0) {
        DTRACE_PROBE1(sample, third, i);
        printf("fire third %d\n", i);
    }
    return i + (int)big;
}

/* The site sits right before the join point of the branch: a window that starts
 * at the site would hold a branch target. Fires for i % 3 == 0 (not printed). */
__attribute__((noinline)) int edge(int i) {
    if (i % 3 == 0)
        DTRACE_PROBE1(sample, edge, i);
    return i * 2;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    long acc = 0;
    int enabled = 0;
    for (int i = 0; i < rounds; i++) {
        acc += step(i, -1000L * i, (short)-i, (signed char)(i - 20), (unsigned char)(200 + i),
                    0xfffffff0u + i);
        acc += edge(i);
        DTRACE_PROBE(sample, zero);
        printf("fire zero\n");
        if (i & 1) {
            DTRACE_PROBE2(sample, pair, i, (short)(i * -7));   /* one name, ... */
            printf("fire pair %d %d\n", i, (short)(i * -7));
        } else {
            DTRACE_PROBE2(sample, pair, -i, (short)(i * 5));   /* ... another site */
            printf("fire pair %d %d\n", -i, (short)(i * 5));
        }
        if (SAMPLE_GUARDED_ENABLED()) {
            long v = expensive(i);
            enabled++;
            DTRACE_PROBE3(sample, guarded, v, (unsigned short)i, (long long)-v);
            printf("fire guarded %ld %u %lld\n", v, (unsigned short)i, (long long)-v);
        }
    }
    printf("acc %ld enabled %d total %ld\n", acc, enabled, total);
    return 0;
}
