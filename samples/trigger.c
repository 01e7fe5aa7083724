/* Benchmark target, shaped like the kernel's uprobe trigger bench: small
 * noinline functions called in a tight loop.
 *
 *   trigger FUNCTION ITERATIONS      FUNCTION: nop | push | ret | usdt
 *
 * "usdt" fires a USDT probe with 2 arguments in the loop instead of calling a
 * function. Prints the nanoseconds per iteration on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>

__attribute__((noinline)) void trigger_nop(void) { __asm__ volatile("nop"); }

__attribute__((noinline, optimize("no-omit-frame-pointer"))) void trigger_push(void) {
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void trigger_ret(void) {}

/* keeps the triggers away from the end of .text, so alignment padding follows them */
__attribute__((noinline)) int trigger_last(int x) { return x * 7 + 3; }

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "nop";
    long n = argc > 2 ? atol(argv[2]) : 100000000L;
    void (*fn)(void) = !strcmp(which, "push") ? trigger_push
                     : !strcmp(which, "ret")  ? trigger_ret : trigger_nop;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (!strcmp(which, "usdt")) {
        for (long i = 0; i < n; i++)
            DTRACE_PROBE2(trigger, usdt, i, n - i);
    } else {
        for (long i = 0; i < n; i++)
            fn();
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.3f\n", ns / n);
    return trigger_last(0) == 3 ? 0 : 1;
}
