/* Benchmark target for probe programs: N calls of `target(i, word, i / 4.0)` in a loop,
 * where word is one of 4 short strings (a string argument a program may read) and the
 * third argument a double (for farg0).
 *
 *   calls N        prints the wall-clock nanoseconds per call on stdout
 *   calls N clock  prints the nanoseconds of a read of the clock a probe program's
 *                  nsecs reads (the time-stamp counter; arm64: the virtual counter),
 *                  N reads in a loop of nothing else
 *
 * urewrite bench --programs builds this file (shipped in the package). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__aarch64__)
#define FLOAT_REGISTER "w"
#else
#define FLOAT_REGISTER "x"
#endif

__attribute__((noinline)) long target(long i, const char *word, double quarter) {
    __asm__ volatile("" : : "r"(word), FLOAT_REGISTER(quarter));  /* keeps them live */
    return i * 3;
}

static inline unsigned long ticks(void) {
#if defined(__aarch64__)
    unsigned long t;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(t));
    return t;
#else
    unsigned int lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return (unsigned long)hi << 32 | lo;
#endif
}

int main(int argc, char **argv) {
    static const char *words[] = {"alpha", "beta", "gamma", "delta"};
    long n = argc > 1 ? atol(argv[1]) : 10000000L, sum = 0;
    int clock = argc > 2 && argv[2][0] == 'c';
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (clock)
        for (long i = 0; i < n; i++)
            sum += (long)ticks();
    else
        for (long i = 0; i < n; i++)
            sum += target(i, words[i & 3], (double)i * 0.25);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.3f\n", ns / (double)n);
    return sum == -1;  /* (never: the sum is used) */
}
