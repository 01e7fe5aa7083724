/* A shared library for the build-system samples (CMake and Bazel): demo_scale(x) calls demo_add once and demo_mul twice. */
#define PROBED __attribute__((noinline, noclone))

static volatile long sink;

PROBED long demo_add(long a, long b) {
    sink += a;
    return a + b + (sink & 1);
}

PROBED long demo_mul(long a, long b) {
    sink += b;
    return a * b + (sink & 1);
}

long demo_scale(long x) {
    return demo_mul(demo_add(x, 1), 3) + demo_mul(x, 2);
}
