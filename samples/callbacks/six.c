/* A function whose fifth and sixth arguments arrive in r8 and r9 (x86_64), called by a
 * loop that keeps six values in callee-saved registers across the calls:
 * tests/test_callbacks.py probes `six` at its entry with callbacks that write r8 to r11
 * (clobbers.c), tests/test_direct_entries.py with programs; the output must be the
 * unprobed program's. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long six(long a, long b, long c, long d, long e, long f)
{
    return a + 3 * b + 5 * c + 7 * d + 11 * e + 13 * f;
}

int main(int argc, char **argv)
{
    /* six values live across every call: in callee-saved registers (rbx, rbp,
     * r12 to r15), which a probe's code must give back as it found them */
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0, a = 1, b = 2, c = 3, d = 4, e = 5;
    for (long i = 0; i < n; i++) {
        long r = six(i, i + 1, i + 2, i + 3, i * 17 + 4, i * 29 + 5);
        sum ^= r + sum * 31;
        a += r ^ b;
        b += r ^ c;
        c += r ^ d;
        d += r ^ e;
        e += r ^ a;
    }
    printf("%ld %ld %ld %ld %ld %ld\n", sum, a, b, c, d, e);
    return 0;
}
