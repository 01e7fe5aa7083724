/* Benchmark target, shaped like the kernel's uprobe trigger bench: small
 * noinline functions called in a tight loop.
 *
 *   trigger FUNCTION ITERATIONS [THREADS]      FUNCTION: nop | push | ret | usdt
 *
 * "usdt" fires a USDT probe with 2 arguments in the loop instead of calling a
 * function. With THREADS (default 1), THREADS threads each run ITERATIONS
 * iterations at once. Prints the wall-clock nanoseconds per iteration of all
 * threads (total time / (ITERATIONS * THREADS)) on stdout (after a line "ready"
 * when TRIGGER_WAIT is set: see main).
 *
 * urewrite bench builds this file (shipped in the package); samples/trigger.c
 * is the same file. Link with -pthread on a glibc older than 2.34. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The USDT site: systemtap's <sys/sdt.h> where it is installed; else (or with
 * -DTRIGGER_OWN_NOTE) the same note written here, so that the file builds on a
 * machine without systemtap-sdt-dev. A note holds the site's address, the base
 * it was linked against (.stapsdt.base, for readers to see a file moved by
 * prelink), the semaphore (none), the provider, the name and each argument as
 * SIZE@OPERAND. */
#if __has_include(<sys/sdt.h>) && !defined(TRIGGER_OWN_NOTE)
#include <sys/sdt.h>
#define TRIGGER_USDT(a, b) DTRACE_PROBE2(trigger, usdt, a, b)
#else
#define TRIGGER_USDT(a, b)                                                       \
    __asm__ __volatile__(                                                        \
        "990: nop\n"                                                            \
        ".pushsection .note.stapsdt, \"\", \"note\"\n"                          \
        ".balign 4\n"                                                           \
        ".4byte 992f-991f, 994f-993f, 3\n"                                      \
        "991: .asciz \"stapsdt\"\n"                                             \
        "992: .balign 4\n"                                                      \
        "993: .8byte 990b, _.stapsdt.base, 0\n"                                 \
        ".asciz \"trigger\"\n.asciz \"usdt\"\n.asciz \"-8@%0 -8@%1\"\n"          \
        "994: .balign 4\n"                                                      \
        ".popsection\n"                                                         \
        ".ifndef _.stapsdt.base\n"                                              \
        ".pushsection .stapsdt.base, \"aG\", \"progbits\", .stapsdt.base, comdat\n" \
        ".weak _.stapsdt.base\n.hidden _.stapsdt.base\n"                        \
        "_.stapsdt.base: .space 1\n.size _.stapsdt.base, 1\n"                   \
        ".popsection\n.endif\n"                                                  \
        : : "r"((long)(a)), "r"((long)(b)))
#endif

/* The three triggers are written in assembly, so that what they start with does
 * not depend on the compiler: trigger_nop is `nop; ret`, trigger_push starts
 * with `push %rbp` (a frame set up and torn down), trigger_ret is a bare `ret`.
 * Each is followed by alignment padding (nops), which a rewriter may borrow for
 * a function shorter than its jump. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".globl trigger_nop\n .type trigger_nop, @function\n"
        "trigger_nop:\n nop\n ret\n .size trigger_nop, .-trigger_nop\n"
        ".p2align 4\n"
        ".globl trigger_push\n .type trigger_push, @function\n"
        "trigger_push:\n push %rbp\n mov %rsp, %rbp\n pop %rbp\n ret\n"
        " .size trigger_push, .-trigger_push\n"
        ".p2align 4\n"
        ".globl trigger_ret\n .type trigger_ret, @function\n"
        "trigger_ret:\n ret\n .size trigger_ret, .-trigger_ret\n"
        ".p2align 4\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".globl trigger_nop\n .type trigger_nop, %function\n"
        "trigger_nop:\n nop\n ret\n .size trigger_nop, .-trigger_nop\n"
        ".p2align 4\n"
        ".globl trigger_push\n .type trigger_push, %function\n"
        "trigger_push:\n stp x29, x30, [sp, #-16]!\n mov x29, sp\n ldp x29, x30, [sp], #16\n ret\n"
        " .size trigger_push, .-trigger_push\n"
        ".p2align 4\n"
        ".globl trigger_ret\n .type trigger_ret, %function\n"
        "trigger_ret:\n ret\n .size trigger_ret, .-trigger_ret\n"
        ".p2align 4\n");
#else
#error "trigger.c: x86_64 or aarch64 only"
#endif

void trigger_nop(void);
void trigger_push(void);
void trigger_ret(void);

/* keeps the triggers away from the end of .text, so alignment padding follows them */
__attribute__((noinline)) int trigger_last(int x) { return x * 7 + 3; }

static const char *which;
static long n;
static pthread_barrier_t start;

static void *loop(void *arg) {
    (void)arg;
    void (*fn)(void) = !strcmp(which, "push") ? trigger_push
                     : !strcmp(which, "ret")  ? trigger_ret : trigger_nop;
    pthread_barrier_wait(&start);
    if (!strcmp(which, "usdt")) {
        for (long i = 0; i < n; i++)
            TRIGGER_USDT(i, n - i);
    } else {
        for (long i = 0; i < n; i++)
            fn();
    }
    return NULL;
}

int main(int argc, char **argv) {
    which = argc > 1 ? argv[1] : "nop";
    n = argc > 2 ? atol(argv[2]) : 100000000L;
    long threads = argc > 3 ? atol(argv[3]) : 1;
    if (n < 1 || threads < 1 || threads > 1024) {
        fprintf(stderr, "usage: trigger nop|push|ret|usdt ITERATIONS [THREADS (1..1024)]\n");
        return 2;
    }
    pthread_t *th = calloc(threads, sizeof *th);
    pthread_barrier_init(&start, NULL, threads);
    struct timespec a, b;
    /* thread 0 is this one; the others are started first and wait at the barrier */
    for (long t = 1; t < threads; t++)
        if (pthread_create(&th[t], NULL, loop, NULL)) {
            fprintf(stderr, "trigger: cannot create thread %ld\n", t);
            return 2;
        }
    /* TRIGGER_WAIT set: say "ready", then wait for a line on stdin before the loop
     * (urewrite bench arms this process live meanwhile) */
    char go[8];
    if (getenv("TRIGGER_WAIT") && (printf("ready\n") < 0 || fflush(stdout) != 0 ||
                                   !fgets(go, sizeof go, stdin)))
        return 2;
    clock_gettime(CLOCK_MONOTONIC, &a);
    loop(NULL);
    for (long t = 1; t < threads; t++)
        pthread_join(th[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.3f\n", ns / ((double)n * threads));
    free(th);
    return trigger_last(0) == 3 ? 0 : 1;
}
