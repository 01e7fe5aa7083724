/* Return probes by return-address redirection. At -O0 each function below has an
 * early return that jumps to the `leave` before its `ret`, and the next function
 * follows with no padding, so no window around that `ret` is safe: its return
 * probe redirects the return address instead. `via` (-O2) leaves by an indirect
 * tail call, which no exit patch can follow either; `die` jumps through a table
 * whose cases are all its own, and never returns.
 * Each case prints how many times its functions returned, for a test to compare.
 *
 *   redirect CASE    CASE: recursion | threads | longjmp | dive | signal | tail | chain |
 *                          fork | die */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int sink;
static jmp_buf jb;

__attribute__((noipa)) int depth(int n) {
    if (n == 0)
        return 0;
    int r = depth(n - 1);
    return r + 1 + sink;
}

__attribute__((noipa)) long work(long x) {
    if (x < 0)
        return 0;
    return x * 3 + sink;
}

/* leaves every fourth frame by longjmp */
__attribute__((noipa)) int maybe_jump(int i) {
    if (i % 4 == 0)
        longjmp(jb, 1);
    if (i < 0)
        return 0;
    return i + sink;
}

/* n frames deep, then longjmp out of all of them at once: n stale entries */
__attribute__((noipa)) int dive(int n) {
    if (n == 0)
        longjmp(jb, 1);
    if (n < 0)
        return 0;
    return dive(n - 1) + sink;
}

__attribute__((noipa)) int nested(int d);
static void handler(int sig) {
    (void)sig;
    sink += nested(0); /* while nested(1) is active below us, on this thread */
}
__attribute__((noipa)) int nested(int d) {
    if (d > 0)
        raise(SIGUSR1);
    if (d < 0)
        return 0;
    return d + sink;
}

__attribute__((noipa)) int twice(int x) {
    if (x < 0)
        return 0;
    return 2 * x + sink;
}
/* at -O2: jmp *%rax, an indirect tail call: twice returns for both */
__attribute__((noipa)) int via(int (*f)(int), int x) { return f(x); }
/* via -> via_twice -> via -> twice, all tail calls at -O2: the second via finds
 * its own stub where its return address is, and still returns once */
__attribute__((noipa)) int via_twice(int x) { return via(twice, x); }

__attribute__((noipa)) int forker(int x) {
    if (x < 0)
        return 0;
    pid_t child = fork(); /* both processes return from here */
    if (child > 0)
        waitpid(child, NULL, 0);
    return child == 0;
}

/* never returns; a jump table at every level */
__attribute__((noipa, noreturn)) void die(int code) {
    switch (code) {
    case 0: puts("zero"); break;
    case 1: puts("one"); break;
    case 2: puts("two"); break;
    case 3: puts("three"); break;
    case 4: puts("four"); break;
    default: puts("many"); break;
    }
    exit(code);
}

static void *run(void *arg) {
    long s = 0;
    for (long i = 0; i < 250000; i++)
        s += work(i);
    return (void *)(s + (long)arg);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "recursion";
    if (!strcmp(c, "recursion")) {
        printf("result %d\nreturns depth %d\n", depth(10000), 10001);
    } else if (!strcmp(c, "threads")) {
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, run, (void *)i);
        long s = 0;
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            s += (long)r;
        }
        printf("result %ld\nreturns work %d\n", s, 4 * 250000);
    } else if (!strcmp(c, "longjmp")) {
        int returned = 0, jumped = 0;
        for (volatile int i = 0; i < 100; i++) {
            if (setjmp(jb) == 0) {
                maybe_jump(i);
                returned++;
            } else {
                jumped++;
            }
        }
        printf("jumped %d\nreturns maybe_jump %d\n", jumped, returned);
    } else if (!strcmp(c, "dive")) {
        /* stale entries pile up under later calls, which still return exactly */
        int returned = 0;
        for (volatile int i = 0; i < 20; i++) {
            if (setjmp(jb) == 0)
                dive(500);
            returned += depth(100) == 100;
        }
        printf("dived 20\nreturns dive 0\nreturns depth %d\n", 101 * returned);
    } else if (!strcmp(c, "signal")) {
        signal(SIGUSR1, handler);
        int n = 0;
        for (int i = 0; i < 50; i++)
            n += nested(1) >= 0;
        printf("ok %d\nreturns nested %d\n", n, 100);
    } else if (!strcmp(c, "tail")) {
        long s = 0;
        for (int i = 0; i < 30; i++)
            s += via(twice, i);
        printf("result %ld\nreturns via %d\nreturns twice %d\n", s, 30, 30);
    } else if (!strcmp(c, "chain")) {
        long s = 0;
        for (int i = 0; i < 20; i++)
            s += via(via_twice, i);
        printf("result %ld\nreturns via %d\nreturns twice %d\n", s, 40, 20);
    } else if (!strcmp(c, "fork")) {
        int in_child = forker(1);
        printf("%s returned\n", in_child ? "child" : "parent");
        fflush(stdout);
        if (in_child)
            _exit(0);
        printf("returns forker 2\n");
    } else if (!strcmp(c, "die")) {
        die(argc > 2 ? atoi(argv[2]) : 3);
    }
    return 0;
}
