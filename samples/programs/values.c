/* A deterministic workload for probe programs: N calls of work(i, i % 7) and of
 * named(word, i), so that every map a program builds over them has known contents.
 *
 *   values N        prints the sum of work()'s results */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long a, long b) { return a * 3 - b * 500; }

__attribute__((noinline)) void named(const char *word, long i) {
    __asm__ volatile("" : : "r"(word), "r"(i));  /* keeps both arguments live */
}

int main(int argc, char **argv) {
    static const char *words[] = {"alpha", "beta", "gamma"};
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < n; i++) {
        sum += work(i, i % 7);
        named(words[i % 3], i);
    }
    printf("%ld\n", sum);
    return 0;
}
