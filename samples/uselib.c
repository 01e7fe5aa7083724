/* A program linked against libdemo.so (see libdemo.c for the library's counts).
 *
 *   uselib             prints what it computed; exits with status 5
 *
 * Expected entry counts of its own functions:
 *   main              1
 *   visit             25    the callback demo_each() calls
 */
#include <stdio.h>

#define NOINLINE __attribute__((noinline, noipa))

int demo_square(int x);
int demo_fib(int n);
long demo_each(int n, long (*callback)(int));
const char *demo_version(void);

NOINLINE long visit(int x) { return x % 7; }

int main(void) {
    long squares = 0;
    for (int i = 0; i < 50; i++)
        squares += demo_square(i);
    int f = demo_fib(12);
    long visited = demo_each(25, visit);
    printf("%s squares=%ld fib=%d visited=%ld\n", demo_version(), squares, f, visited);
    printf("%s\n", demo_version());
    return 5;
}
