/* Threads that each walk a recursion, for the tests of `trace --format perfetto`.
 *
 *   call_tree [THREADS [ROUNDS [DEPTH [PAUSE_MS]]]]
 *                       default: 3 threads, 4 rounds, depth 5, no pause; exits 0
 *
 * Each thread names itself "tree-K" (K = 1..THREADS), then calls worker(K), which
 * runs ROUNDS rounds of descend(DEPTH), which recurses down to descend(0); every
 * level calls leaf(n) once. descend(n) returns leaf(0) + ... + leaf(n), where
 * leaf(n) = n * n. With PAUSE_MS, each round starts after that pause (a tracer
 * reads the events between rounds). Each thread then lingers LINGER_MS, so that a
 * tracer can still read its name.
 *
 * Entries, and returns (each call returns), for one run:
 *   main          1                                (the main thread)
 *   worker        THREADS                          (one per thread)
 *   descend       THREADS x ROUNDS x (DEPTH + 1)   (default 72; nested DEPTH + 1 deep)
 *   leaf          THREADS x ROUNDS x (DEPTH + 1)   (default 72)
 * Prints the total of all descend(DEPTH) results.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noipa))
#define MAX_THREADS 64
#define LINGER_MS 300

static int rounds = 4, depth = 5, pause_ms;

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

NOINLINE long leaf(long n) { return n * n; }

static volatile long sink;

/* No tail calls (a return probe fires at a tail call's jump, before the callee
   has made the value): every call returns its own value through a ret. */
NOINLINE long descend(long n) {
    long below = n > 0 ? descend(n - 1) : 0; /* the frames nest */
    long r = below + leaf(n);
    sink = r;
    return r;
}

NOINLINE long worker(long k) {
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        if (pause_ms)
            sleep_ms(pause_ms);
        total += descend(depth);
    }
    return total + k - k;
}

/* Names the thread before any probed function runs, and lingers after. */
static void *start(void *arg) {
    long k = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "tree-%ld", k);
    pthread_setname_np(pthread_self(), name);
    long total = worker(k);
    sleep_ms(LINGER_MS);
    return (void *)total;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 3;
    if (argc > 2)
        rounds = atoi(argv[2]);
    if (argc > 3)
        depth = atoi(argv[3]);
    if (argc > 4)
        pause_ms = atoi(argv[4]);
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    pthread_t tid[MAX_THREADS];
    for (long k = 0; k < threads; k++)
        if (pthread_create(&tid[k], NULL, start, (void *)(k + 1)) != 0)
            return 3;
    long total = 0;
    for (int k = 0; k < threads; k++) {
        void *r;
        pthread_join(tid[k], &r);
        total += (long)r;
    }
    printf("total=%ld\n", total);
    return 0;
}
