/* Functions whose entry counts are known from the source, for the hit-count tests.
 *
 *   counts            prints what it computed; exits with status 3
 *
 * NOINLINE functions (noinline + noipa, so that no -O level inlines, clones,
 * folds or hoists them) and the number of times each is entered in one run,
 * which tests/test_matrix.py hard-codes:
 *
 *   main              1
 *   square            100    a plain loop, i = 0..99
 *   fib               1973   fib(15) recursive: 2 * F(16) - 1 = 2 * 987 - 1
 *   add_one           20     \
 *   twice             20      } 60 calls through a table of function pointers, i % 3
 *   negate            20     /
 *   apply             60     calls its callback once per call
 *   cmp_int           (qsort's business) counted by the program, printed as cmp_calls=N
 *   sort_numbers      1      qsort() of 64 numbers with cmp_int as the callback
 *   classify          200    a switch with 12 cases, i = 0..199 (i % 13)
 *   is_even           6      is_even(10): mutual recursion, 10, 8, 6, 4, 2, 0
 *   is_odd            5      9, 7, 5, 3, 1
 *   total_length      7      strlen() of 7 words
 *   make_buffer       4      malloc()
 *   release           4      free()
 *   report            3      printf()
 *   never_called      0      only when there are more than 100 arguments
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile int sink;
static long cmp_calls;

NOINLINE int square(int x) { return x * x; }

NOINLINE int fib(int n) {
    if (n < 2)
        return n;
    int r = fib(n - 1) + fib(n - 2);
    sink = r; /* no accumulator tail recursion: both calls stay calls */
    return r;
}

NOINLINE int add_one(int x) { return x + 1; }
NOINLINE int twice(int x) { return 2 * x; }
NOINLINE int negate(int x) { return -x; }

NOINLINE int apply(int (*f)(int), int x) {
    int r = f(x);
    sink = r;
    return r;
}

NOINLINE int cmp_int(const void *a, const void *b) {
    cmp_calls++;
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

NOINLINE void sort_numbers(int *v, size_t n) { qsort(v, n, sizeof *v, cmp_int); }

NOINLINE int classify(int c) {
    switch (c) {
    case 0: return 17;
    case 1: return 4;
    case 2: return 91;
    case 3: return 33;
    case 4: return 8;
    case 5: return 56;
    case 6: return 71;
    case 7: return 2;
    case 8: return 64;
    case 9: return 29;
    case 10: return 45;
    case 11: return 13;
    default: return -1;
    }
}

NOINLINE int is_odd(int n);
NOINLINE int is_even(int n) { return n == 0 ? 1 : is_odd(n - 1); }
NOINLINE int is_odd(int n) { return n == 0 ? 0 : is_even(n - 1); }

NOINLINE size_t total_length(const char *s) { return strlen(s); }

NOINLINE char *make_buffer(size_t n) {
    char *p = malloc(n);
    if (p)
        memset(p, 'x', n);
    return p;
}

NOINLINE void release(char *p) { free(p); }

NOINLINE void report(const char *what, long value) { printf("%s=%ld\n", what, value); }

NOINLINE void never_called(void) { puts("never"); }

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 100)
        never_called();

    long squares = 0;
    for (int i = 0; i < 100; i++)
        squares += square(i);

    int (*const ops[3])(int) = {add_one, twice, negate};
    long applied = 0;
    for (int i = 0; i < 60; i++)
        applied += apply(ops[i % 3], i);

    int numbers[64];
    unsigned seed = 12345;
    for (int i = 0; i < 64; i++) {
        seed = seed * 1103515245u + 12345u;
        numbers[i] = (int)(seed >> 16) % 1000;
    }
    sort_numbers(numbers, 64);

    long classes = 0;
    for (int i = 0; i < 200; i++)
        classes += classify(i % 13);

    static const char *const words[7] = {"alpha", "beta", "gamma", "delta",
                                         "epsilon", "zeta", "eta"};
    size_t length = 0;
    for (int i = 0; i < 7; i++)
        length += total_length(words[i]);

    long filled = 0;
    for (int i = 1; i <= 4; i++) {
        char *p = make_buffer((size_t)i * 32);
        filled += p ? p[i] == 'x' : 0;
        release(p);
    }

    printf("squares=%ld applied=%ld fib=%d even=%d\n", squares, applied, fib(15), is_even(10));
    printf("sorted=%d,%d,%d classes=%ld length=%zu filled=%ld\n", numbers[0], numbers[31],
           numbers[63], classes, length, filled);
    report("cmp_calls", cmp_calls);
    report("sink", sink);
    report("done", 1);
    return 3;
}
