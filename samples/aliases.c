/* One function known by three names, for the tests of names as asked.
 *
 *   aliases [N]        default N = 7; prints the sum; exits 0
 *
 * __sum_impl has two aliases, sum and total: three symbols at one address, one
 * function. It is entered N times (through a volatile pointer, so that no -O level
 * inlines the calls), whichever name the program or a probe uses. twice() is an
 * unrelated function without aliases, entered N times too.
 */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noipa))

NOINLINE long __sum_impl(long a, long b) { return a + b; }
long sum(long a, long b) __attribute__((alias("__sum_impl")));
long total(long a, long b) __attribute__((alias("__sum_impl")));

NOINLINE long twice(long x) { return 2 * x; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 7;
    long (*volatile add)(long, long) = sum;
    long s = 0;
    for (int i = 0; i < n; i++)
        s = add(s, twice(i));
    printf("sum=%ld\n", s);
    return 0;
}
