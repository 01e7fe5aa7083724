/* Benchmark target for probe programs: N calls of `target(i, word, i / 4.0)` in a loop,
 * where word is one of 4 short strings (a string argument a program may read) and the
 * third argument a double (for farg0).
 *
 *   calls N      prints the wall-clock nanoseconds per call on stdout
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

int main(int argc, char **argv) {
    static const char *words[] = {"alpha", "beta", "gamma", "delta"};
    long n = argc > 1 ? atol(argv[1]) : 10000000L, sum = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        sum += target(i, words[i & 3], (double)i * 0.25);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.3f\n", ns / (double)n);
    return sum == -1;  /* (never: the sum is used) */
}
