/* A function the compiler splits: its unlikely path goes into a part of its own
 * (f.cold, with an .eh_frame entry of its own) that starts inside f's frame and
 * jumps back into f. Stripped, that part looks like a function (fn_<address>).
 * A return probe on f must count f's returns, whichever path each call took.
 *
 *   fragments        prints the sum and how many times f returned */
#include <stdio.h>

static volatile int sink;

__attribute__((noinline)) int g(int x) { return x + sink; }

__attribute__((noinline, cold)) void report(int x) { fprintf(stderr, "odd %d\n", x); }

__attribute__((noinline)) int f(int x, int y) {
    int a = g(x), b = g(y); /* values kept across calls: f has a frame */
    int r = a * b + g(a + b);
    if (__builtin_expect(r % 5 == 1, 0)) {
        report(r);
        return r ^ a ^ b;
    }
    return r + a - b;
}

int main(void) {
    long s = 0;
    for (int i = 0; i < 100; i++)
        s += f(i, i + 1);
    printf("sum %ld\nreturns f %d\n", s, 100);
    return 0;
}
