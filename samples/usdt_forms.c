/* USDT argument forms (x86_64): for every probe it fires, the program prints
 * "fire PROBE ARGS..." with the values it passed, so a test can compare them
 * with what `urewrite trace` recorded.
 *
 *   usdt_forms [ROUNDS]     (default 3)
 *
 * What the compiler writes for each argument depends on the optimisation level
 * and the code model; between them, -O0/-O2 and PIE/non-PIE/static builds give:
 * registers of every width (%edi %rsi %dx %cl %r8d %r9 %al ...), stack slots
 * (-20(%rbp), 8(%rsp)), base + index * scale + displacement, RIP-relative globals
 * with offsets into a struct or an array (`8+stats(%rip)`), constants cut to
 * their size (`1@$-56` for 200), thread-local variables through %fs
 * (`%fs:tls_int@tpoff`, `%fs:16+tls_arr@tpoff`, `%fs:tls_arr@tpoff(,%rcx,8)`),
 * and 12 arguments (-fno-pie -no-pie for the absolute ones). The forms no compiler writes here (high-byte registers,
 * `N+sym(%rip)` as GCC writes it for postgres, absolute addresses in non-PIE code,
 * %fs with a constant) are written by hand. One probe passes a double: it is
 * refused (trace records integers), and the others are not held back by it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

struct stats {
    long a;
    int b;
    short c;
    signed char d;
    unsigned char e;
    long arr[4];
} stats = {1, -2, -3, -4, 250, {10, -20, 30, -40}};
int arr[8] = {1, -2, 3, -4, 5, -6, 7, -8};
static long s_long = -77;
unsigned char g_u8 = 200;
unsigned long g_big = 0xfedcba9876543210UL;
__thread int tls_int = 5;
__thread long tls_arr[4] = {100, -200, 300, -400};
volatile long sink;

__attribute__((noinline)) void registers(int i, long l, short s, signed char c, unsigned u,
                                         unsigned long ul, unsigned short us, unsigned char uc) {
    DTRACE_PROBE8(forms, registers, i, l, s, c, u, ul, us, uc);
    printf("fire registers %d %ld %d %d %u %lu %u %u\n", i, l, s, c, u, ul, us, uc);
}

__attribute__((noinline)) void globals(int i) {
    DTRACE_PROBE6(forms, globals, stats.b, stats.c, stats.arr[2], arr[3], s_long, g_u8);
    printf("fire globals %d %d %ld %d %ld %u\n", stats.b, stats.c, stats.arr[2], arr[3], s_long,
           g_u8);
    DTRACE_PROBE4(forms, indexed, arr[i & 7], stats.arr[i & 3], g_big, stats.d);
    printf("fire indexed %d %ld %lu %d\n", arr[i & 7], stats.arr[i & 3], g_big, stats.d);
}

__attribute__((noinline)) void thread_locals(int i) {
    DTRACE_PROBE3(forms, tls, tls_int, tls_arr[2], tls_arr[i & 3]);
    printf("fire tls %d %ld %ld\n", tls_int, tls_arr[2], tls_arr[i & 3]);
}

__attribute__((noinline)) void constants(void) {
    DTRACE_PROBE6(forms, constants, 5, -1, 0x123456789abLL, (unsigned char)200, (short)-300,
                  0xffffffffffffffffULL);
    printf("fire constants 5 -1 %lld %u %d %llu\n", 0x123456789abLL, (unsigned char)200,
           (short)-300, 0xffffffffffffffffULL);
}

__attribute__((noinline)) void locals(long l, int i) {
    long local[3] = {l, l * 2, l * 3};
    volatile int vl = i * 7;
    unsigned short us = (unsigned short)(60000 + i);
    DTRACE_PROBE4(forms, locals, local[1], vl, local[i % 3], us);
    printf("fire locals %ld %d %ld %u\n", local[1], vl, local[i % 3], us);
    sink = local[0] + local[2];
}

__attribute__((noinline)) void twelve(long x) {
    DTRACE_PROBE12(forms, twelve, x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7, x + 8,
                   x + 9, x + 10, x + 11);
    printf("fire twelve");
    for (int k = 0; k < 12; k++)
        printf(" %ld", x + k);
    printf("\n");
}

/* forms GCC does not write here, by hand */
__attribute__((noinline)) void by_hand(long wide, long *base) {
#if defined(__x86_64__)
    /* high bytes; N+sym(%rip) and sym+N(%rip) (postgres's `40+CheckpointStats(%rip)`);
     * the thread pointer through %fs; a segment that adds nothing */
    __asm__ volatile(STAP_PROBE_ASM(forms, high,
                                    ".ascii \"1@%%ah -1@%%ah 2@%%ax -1@%%al 8@%%rax\"\n", "")
                     : : "a"(wide));
    printf("fire high %lu %d %lu %d %lu\n", (unsigned long)(unsigned char)(wide >> 8),
           (signed char)(wide >> 8), (unsigned long)(unsigned short)wide, (signed char)wide,
           (unsigned long)wide);
    __asm__ volatile(STAP_PROBE_ASM(forms, symbols,
                                    ".ascii \"-4@8+stats(%%rip) -2@stats+12(%%rip) "
                                    "-8@stats+48-8(%%rip) 8@%%fs:0 -4@%%ds:8+stats(%%rip)\"\n",
                                    "") : :);
    printf("fire symbols %d %d %ld %lu %d\n", stats.b, stats.c, stats.arr[3],
           (unsigned long)__builtin_thread_pointer(), stats.b);
#ifndef __PIE__
    /* absolute addresses: non-PIE code only */
    __asm__ volatile(STAP_PROBE_ASM(forms, absolute,
                                    ".ascii \"-4@stats+8 -8@stats+16(,%%rcx,8)\"\n", "")
                     : : "c"(wide & 3));
    printf("fire absolute %d %ld\n", stats.b, stats.arr[wide & 3]);
#endif
    (void)base;
#elif defined(__aarch64__)
    /* narrow views of one register (w and x), register plus register */
    long i = wide & 3, unaligned;
    __asm__ volatile(STAP_PROBE_ASM(forms, views,
                                    ".ascii \"-1@%w0 2@%w0 -4@%w0 4@%x0 -8@%x0 "
                                    "-8@[%1, %2] 8@[%1, %2, lsl 3]\"\n", "")
                     : : "r"(wide), "r"(base), "r"(i) : "memory");
    memcpy(&unaligned, (char *)base + i, sizeof unaligned);
    printf("fire views %d %u %d %u %ld %ld %ld\n", (signed char)wide, (unsigned short)wide,
           (int)wide, (unsigned)wide, wide, unaligned, base[i]);
#else
    (void)wide;
    (void)base;
#endif
}

__attribute__((noinline)) void floating(double d) {
    DTRACE_PROBE1(forms, floating, d);
}

static void *worker(void *arg) {
    int t = (int)(long)arg;
    tls_int = 1000 + t;
    tls_arr[t & 3] = -1000 - t;
    thread_locals(t);
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    for (int k = 0; k < rounds; k++) {
        s_long -= k;
        stats.b += k;
        tls_int += k;
        registers(argc + k, -1000L * k - 1, (short)(-5 - k), (signed char)('a' + k),
                  4000000000u + k, 0xfffffffffffUL + k, (unsigned short)(65000 + k),
                  (unsigned char)(250 + k));
        globals(k);
        thread_locals(k);
        constants();
        locals(-3L * k, k);
        twelve(-6 + k);
        long table[6] = {11, -22, 33, -44, 55, -66};
        by_hand(0x7edcba98f6e5d4c3L + k * 0x101, table);
        floating(k + 0.5);
    }
    /* one thread at a time: the events come in program order */
    for (int t = 0; t < 2; t++) {
        pthread_t th;
        pthread_create(&th, NULL, worker, (void *)(long)t);
        pthread_join(th, NULL);
    }
    return 0;
}
