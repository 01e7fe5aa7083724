/* Indirect jumps that may stay in their function or leave it, for the tests of exits
 * checked where they go (tests/test_indirect_exits.py). No jump table here can be
 * recovered: a computed goto has no bounds check, a pointer can go anywhere.
 *
 *   indirect_exits [ROUNDS]   prints what it computed and "returns NAME N" per function
 *
 *   ie_interp     a computed-goto interpreter: jumps that stay, many per call
 *   ie_via        a tail call through a pointer: a jump that leaves
 *   ie_mixed      a computed goto to its own labels or a tail call through a pointer,
 *                 from the same kind of jump, depending on its argument
 *   ie_again      a tail call to itself through a pointer: a jump to its own entry,
 *                 which enters it anew (each level is a call that returns)
 *   ie_cold       a computed goto in a function with a rarely run part that GCC may
 *                 split off into ie_cold.cold: two ranges to stay in
 *   ie_offsets    a computed goto through offsets from one of its labels, as glibc's
 *                 vfprintf does: no table of addresses names its labels, so any of its
 *                 instructions may be one (a window there must hold one instruction)
 *   ie_leaf       what the pointers call
 *
 * Every function is NOINLINE (no -O level inlines, clones or folds it).
 */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile int sink;
static long calls[7];
enum { INTERP, VIA, MIXED, AGAIN, COLD, OFFSETS, LEAF };

NOINLINE int ie_leaf(int x) {
    calls[LEAF]++;
    return x * 3 + sink;
}

static int (*volatile leaf_pointer)(int) = ie_leaf;

NOINLINE int ie_interp(const unsigned char *code) {
    static void *ops[] = {&&inc, &&twice, &&end};
    int acc = sink;
    calls[INTERP]++;
    goto *ops[*code++];
inc:
    acc++;
    goto *ops[*code++];
twice:
    acc *= 2;
    goto *ops[*code++];
end:
    return ie_leaf(acc);  /* a direct tail call: no 1-byte `ret` right before a label */
}

NOINLINE int ie_via(int (*f)(int), int x) {
    calls[VIA]++;
    return f(x);
}

NOINLINE int ie_mixed(int i) {
    static void *labels[] = {&&a, &&b};
    calls[MIXED]++;
    if (i % 3 == 0)
        return leaf_pointer(i);  /* leaves */
    goto *labels[i & 1];         /* stays */
a:
    return i + sink;
b:
    return i - sink;
}

NOINLINE int ie_again(int n);
static int (*volatile again_pointer)(int) = ie_again;

NOINLINE int ie_again(int n) {
    calls[AGAIN]++;
    if (n <= 0)
        return sink;
    return again_pointer(n - 1);  /* enters itself anew */
}

__attribute__((cold, noinline)) static void complain(int i) {
    fprintf(stderr, "odd input %d\n", i);
}

NOINLINE int ie_cold(int i) {
    static void *labels[] = {&&x, &&y, &&z};
    int r = sink;
    calls[COLD]++;
    if (__builtin_expect(i < 0, 0)) {
        complain(i);
        r += 100;
    }
    goto *labels[(i < 0 ? -i : i) % 3];
x:
    return ie_leaf(r + 1);
y:
    return ie_leaf(r * 2);
z:
    return ie_leaf(r ^ 5);
}

NOINLINE int ie_offsets(int i) {
    static const int offsets[] = {&&l0 - &&l0, &&l1 - &&l0, &&l2 - &&l0, &&l3 - &&l0};
    int r = sink;
    calls[OFFSETS]++;
    goto *(&&l0 + offsets[i & 3]);
l0:
    return r + i;
l1:
    return r - i;
l2:
    return r * i;
l3:
    return r ^ i;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    static const unsigned char program[] = {0, 0, 1, 0, 1, 0, 2};
    long total = 0;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < 7; i++)
            total += ie_interp(program + (i & 1));
        for (int i = 0; i < 5; i++)
            total += ie_via(leaf_pointer, i);
        for (int i = 0; i < 9; i++)
            total += ie_mixed(i);
        total += ie_again(4);
        for (int i = -1; i < 6; i++)
            total += ie_cold(i);
        for (int i = 0; i < 8; i++)
            total += ie_offsets(i);
    }
    printf("total %ld\n", total);
    static const char *names[] = {"ie_interp", "ie_via", "ie_mixed", "ie_again", "ie_cold",
                                  "ie_offsets", "ie_leaf"};
    for (int k = 0; k < 7; k++)
        printf("returns %s %ld\n", names[k], calls[k]);
    return 0;
}
