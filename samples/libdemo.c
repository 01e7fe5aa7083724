/* A shared library with noinline functions whose entry counts are known; used by uselib.c.
 *
 *   gcc -shared -fPIC -Wl,-soname,libdemo.so libdemo.c -o libdemo.so
 *
 * Expected entry counts for one run of uselib:
 *   demo_square       50
 *   demo_fib          465   demo_fib(12) recursive: 2 * F(13) - 1 = 2 * 233 - 1
 *   demo_each         1     calls the program's callback 25 times
 *   demo_scale        25    internal (static), once per callback
 *   demo_version      2
 *   demo_unused       0
 */
#define NOINLINE __attribute__((noinline, noipa))

static volatile int demo_sink;

NOINLINE int demo_square(int x) { return x * x; }

NOINLINE int demo_fib(int n) {
    if (n < 2)
        return n;
    int r = demo_fib(n - 1) + demo_fib(n - 2);
    demo_sink = r;
    return r;
}

NOINLINE static int demo_scale(int x) { return 3 * x + 1; }

NOINLINE long demo_each(int n, long (*callback)(int)) {
    long total = 0;
    for (int i = 0; i < n; i++)
        total += callback(demo_scale(i));
    return total;
}

NOINLINE const char *demo_version(void) { return "demo 1.0"; }

NOINLINE int demo_unused(int x) { return x - 7 + demo_sink; }
