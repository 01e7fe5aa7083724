/* Return-probe sample: each case prints how many times its function returned,
 * counted by the program itself, for a test to compare with `urewrite stat`.
 *
 *   returns CASE      CASE: recursion | threads | longjmp | signal | tail */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile int sink;

/* not a tail call: the addition after the call keeps every frame. noipa (not just
 * noinline): gcc would otherwise clone the first levels (depth.constprop.N) */
__attribute__((noipa)) int depth(int n) {
    if (n == 0)
        return 0;
    int r = depth(n - 1);
    return r + 1 + sink;
}

__attribute__((noipa)) long work(long x) { return x * 3 + sink; }

static void *run(void *arg) {
    long s = 0;
    for (long i = 0; i < 250000; i++)
        s += work(i);
    return (void *)s;
}

static jmp_buf jb;
__attribute__((noipa)) int maybe_jump(int i) {
    if (i % 4 == 0)
        longjmp(jb, 1); /* leaves this frame without returning */
    return i + sink;
}

__attribute__((noipa)) int nested(int depth_left);
static volatile int in_handler;
static void handler(int sig) {
    (void)sig;
    in_handler = 1;
    sink += nested(0); /* the probed function, while it is active below us */
    in_handler = 0;
}
__attribute__((noipa)) int nested(int depth_left) {
    if (depth_left > 0)
        raise(SIGUSR1);
    return depth_left + sink;
}

__attribute__((noipa)) int callee(int x) { return x * 2 + sink; }
/* ends in a tail call when x > 0 */
__attribute__((noipa)) int tail(int x) {
    if (x > 0)
        return callee(x - 1);
    return -1 + sink;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "recursion";
    if (!strcmp(c, "recursion")) {
        printf("result %d\nreturns depth %d\n", depth(10000), 10001);
    } else if (!strcmp(c, "threads")) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, run, NULL);
        long s = 0;
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            s += (long)r;
        }
        printf("result %ld\nreturns work %d\n", s, 4 * 250000);
    } else if (!strcmp(c, "longjmp")) {
        /* volatile: changed between setjmp and longjmp, else indeterminate after it
         * (arm64 gcc -O2 moves returned++ before the call) */
        volatile int returned = 0, jumped = 0;
        for (volatile int i = 0; i < 100; i++) {
            if (setjmp(jb) == 0) {
                maybe_jump(i);
                returned++;
            } else {
                jumped++;
            }
        }
        printf("jumped %d\nreturns maybe_jump %d\n", jumped, returned);
    } else if (!strcmp(c, "signal")) {
        signal(SIGUSR1, handler);
        int n = 0;
        for (int i = 0; i < 50; i++)
            n += nested(1) >= 0; /* each returns once, and its handler's call once */
        printf("ok %d\nreturns nested %d\n", n, 100);
    } else if (!strcmp(c, "tail")) {
        long s = 0;
        for (int i = -20; i < 30; i++)
            s += tail(i);
        printf("result %ld\nreturns tail %d\nreturns callee %d\n", s, 50, 29);
    }
    return 0;
}
