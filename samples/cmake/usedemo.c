/* Calls libdemo's demo_scale N times (argument 1, default 10): demo_add N hits, demo_mul 2N. */
#include <stdio.h>
#include <stdlib.h>

long demo_scale(long x);

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 10;
    long total = 0;
    for (long i = 0; i < n; i++)
        total += demo_scale(i);
    printf("scaled %ld values, total %ld\n", n, total);
    return 0;
}
