/* The library of samples/live_server.c: one call of live_step per request.
 *
 *   gcc -shared -fPIC -Wl,-soname,liblive.so live_lib.c -o liblive.so
 */
#define NOINLINE __attribute__((noinline, noipa))

NOINLINE long live_step(long x) { return x ^ (x >> 2); }
