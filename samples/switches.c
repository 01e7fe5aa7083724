/* Dense switches, which GCC compiles to jump tables, for the jump-table tests.
 *
 *   switches          prints what it computed and "returns NAME N" per function
 *
 * Every function below is NOINLINE (noinline + noipa: no -O level inlines, clones
 * or folds it) and is called the number of times the program prints. They differ
 * in what GCC makes of them:
 *
 *   sw_small      5 cases of int             a small table (bytes or words on arm64)
 *   sw_medium     12 cases, first case 10    the index biased (x - 10) before the check
 *   sw_large      40 cases of unsigned       a table of 40 entries
 *   sw_char       9 cases of unsigned char   a zero-extended byte index
 *   sw_long       10 cases of long           a 64-bit comparison
 *   sw_two        two switches in one function, each with its own table
 *   sw_loop       a switch inside a loop, cases that return early
 *   sw_goto       a computed goto (`goto *labels[i]`): a table with no bounds check,
 *                 which no recogniser may take for a switch
 *   sw_pointer    a tail call through a function pointer: an indirect jump that leaves
 *   sw_call       a call through a function pointer (arm64: blr), which is no exit
 */
#include <stdio.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile int sink;

NOINLINE int sw_small(int x) {
    switch (x) {
    case 0: return sink + 11;
    case 1: return sink * 3 + 7;
    case 2: return sink - 5;
    case 3: return sink ^ 0x55;
    case 4: return sink + 1000;
    default: return -1;
    }
}

NOINLINE int sw_medium(int x) {
    int r = 0;
    switch (x) {
    case 10: r = sink + 1; break;
    case 11: r = sink * 2; break;
    case 12: r = sink - 3; break;
    case 13: r = sink ^ 4; break;
    case 14: r = sink + 55; break;
    case 15: r = sink * 6 + 1; break;
    case 16: r = sink - 77; break;
    case 17: r = sink ^ 8; break;
    case 18: r = sink + 909; break;
    case 19: r = sink * 10 + 3; break;
    case 20: r = sink - 1111; break;
    case 21: r = sink ^ 12; break;
    default: r = -2;
    }
    return r + x;
}

NOINLINE unsigned sw_large(unsigned x) {
    switch (x) {
#define C(n) case n: return sink * (n + 3) + (n ^ 0x5a);
    C(0) C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9)
    C(10) C(11) C(12) C(13) C(14) C(15) C(16) C(17) C(18) C(19)
    C(20) C(21) C(22) C(23) C(24) C(25) C(26) C(27) C(28) C(29)
    C(30) C(31) C(32) C(33) C(34) C(35) C(36) C(37) C(38) C(39)
#undef C
    default: return 7;
    }
}

NOINLINE int sw_char(unsigned char c) {
    switch (c) {
    case 'a': return sink + 1;
    case 'b': return sink + 20;
    case 'c': return sink * 3;
    case 'd': return sink - 400;
    case 'e': return sink + 5000;
    case 'f': return sink ^ 66;
    case 'g': return sink * 7 + 1;
    case 'h': return sink - 8;
    case 'i': return sink + 99;
    default: return 0;
    }
}

NOINLINE long sw_long(long v) {
    switch (v) {
    case 0: return sink + 100L;
    case 1: return sink * 21L;
    case 2: return sink - 302L;
    case 3: return sink + 4003L;
    case 4: return sink ^ 504L;
    case 5: return sink * 65L + 1;
    case 6: return sink - 706L;
    case 7: return sink + 8007L;
    case 8: return sink ^ 908L;
    case 9: return sink * 109L;
    default: return -3;
    }
}

NOINLINE int sw_two(int a, int b) {
    int r;
    switch (a) {
    case 0: r = sink + 3; break;
    case 1: r = sink * 5; break;
    case 2: r = sink - 7; break;
    case 3: r = sink ^ 9; break;
    case 4: r = sink + 11; break;
    case 5: r = sink * 13; break;
    default: r = 1;
    }
    switch (b) {
    case 0: return r + sink + 2;
    case 1: return r * 4 + sink;
    case 2: return r - 6 - sink;
    case 3: return r ^ 8 ^ sink;
    case 4: return r + 10 * sink;
    case 5: return r * 12 - sink;
    case 6: return r - 14 + sink;
    default: return r;
    }
}

NOINLINE int sw_loop(int n) {
    int r = 0;
    for (int i = 0; i < n; i++) {
        switch ((i * 7 + n) % 11) {
        case 0: r += sink + 1; break;
        case 1: r -= sink + 2; break;
        case 2: r ^= 3; break;
        case 3: r += 4 * i; break;
        case 4: r -= i; break;
        case 5: r *= 3; break;
        case 6: if (r > 1000) return r; r += 6; break;
        case 7: r += sink * 7; break;
        case 8: if (r < -1000) return -r; r -= 8; break;
        case 9: r |= 9; break;
        default: r += 10;
        }
    }
    return r;
}

NOINLINE int sw_goto(int i) {
    static void *labels[] = {&&l0, &&l1, &&l2, &&l3};
    int r = sink;
    goto *labels[i & 3];
l0: return r + 1;
l1: return r * 2;
l2: return r - 3;
l3: return r ^ 4;
}

static int twice(int x) { return 2 * x + sink; }
static int thrice(int x) { return 3 * x + sink; }
static int (*volatile pick[2])(int) = {twice, thrice};

NOINLINE int sw_pointer(int x) { return pick[x & 1](x); }
NOINLINE int sw_call(int x) { return pick[x & 1](x) + 1; }

int main(void) {
    long total = 0;
    int calls = 0;
#define CALL(name, expr, n) \
    for (int i = 0; i < (n); i++) total += (expr); \
    printf("returns %s %d\n", name, (n)); calls++
    CALL("sw_small", sw_small(i % 7 - 1), 30);
    CALL("sw_medium", sw_medium(i % 15 + 8), 45);
    CALL("sw_large", (long)sw_large((unsigned)i % 43), 86);
    CALL("sw_char", sw_char((unsigned char)('a' - 1 + i % 12)), 24);
    CALL("sw_long", sw_long((long)(i % 13) - 1), 39);
    CALL("sw_two", sw_two(i % 8, i % 9), 72);
    CALL("sw_loop", sw_loop(i * 5), 40);
    CALL("sw_goto", sw_goto(i), 8);
    CALL("sw_pointer", sw_pointer(i), 10);
    CALL("sw_call", sw_call(i), 12);
    printf("total %ld after %d functions\n", total, calls);
    return 0;
}
