/* A function whose fifth and sixth arguments arrive in r8 and r9 (x86_64) and a loop
 * that keeps values in r10 and r11 across its calls where the compiler likes:
 * tests/test_callbacks.py probes `six` at its entry with callbacks that write r8 to r11
 * (clobbers.c), and the output must be the unprobed program's. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long six(long a, long b, long c, long d, long e, long f)
{
    return a + 3 * b + 5 * c + 7 * d + 11 * e + 13 * f;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < n; i++)
        sum ^= six(i, i + 1, i + 2, i + 3, i * 17 + 4, i * 29 + 5) + sum * 31;
    printf("%ld\n", sum);
    return 0;
}
