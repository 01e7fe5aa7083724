/* A deterministic workload for probe programs: N calls of work(i, i % 7) and of
 * named(word, i), so that every map a program builds over them has known contents.
 *
 *   values N [T]    prints the sum of work()'s results; T threads make the calls
 *                   between them (i = t, t + T, ...): the same calls, the same maps
 *
 * Built as C or C++ (-x c++: work and named get C++ names), and split in two with
 * -DVALUES_LIBRARY (work and named alone, for a shared object) and -DVALUES_MAIN
 * (the rest, linked with it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef VALUES_MAIN
long work(long a, long b);
void named(const char *word, long i);
#else
__attribute__((noinline)) long work(long a, long b) { return a * 3 - b * 500; }

__attribute__((noinline)) void named(const char *word, long i) {
    __asm__ volatile("" : : "r"(word), "r"(i));  /* keeps both arguments live */
}
#endif

#ifndef VALUES_LIBRARY
static long calls, threads = 1;

static void *make_calls(void *first) {
    static const char *words[] = {"alpha", "beta", "gamma"};
    long sum = 0;
    for (long i = (long)first; i < calls; i += threads) {
        sum += work(i, i % 7);
        named(words[i % 3], i);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    calls = argc > 1 ? atol(argv[1]) : 1000;
    threads = argc > 2 ? atol(argv[2]) : 1;
    long sum = 0;
    if (threads <= 1) {
        threads = 1;
        sum = (long)make_calls(0);
    } else {
        pthread_t ids[64];
        threads = threads > 64 ? 64 : threads;
        for (long t = 0; t < threads; t++)
            pthread_create(&ids[t], NULL, make_calls, (void *)t);
        for (long t = 0; t < threads; t++) {
            void *part;
            pthread_join(ids[t], &part);
            sum += (long)part;
        }
    }
    printf("%ld\n", sum);
    return 0;
}
#endif
