/* Functions whose code before their first call is shorter than a jump (5 bytes), so a
 * plain jump at the entry would displace the call: at -O1 and above, `wrap_*` start
 * `sub rsp,8; call` (after `endbr64` where the compiler adds it), `keep_*` save a
 * register first. The rewrite hops over them instead (a 2-byte jump to a landing in
 * the padding after a function), and the call runs where it is.
 *
 *   call_prologue N     calls each wrapper N times; prints each one's count and a sum */
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;
static long calls[4];

__attribute__((noipa)) long leaf(long x) { return x + sink; }
__attribute__((noipa)) long wrap_one(long x) { return leaf(x) + 1; }
__attribute__((noipa)) long wrap_two(long x) { return leaf(x) * 2; }
__attribute__((noipa)) long keep_one(long x) { long r = leaf(x); return r + x; }
__attribute__((noipa)) long keep_two(long x) { long r = leaf(x + 1); return r ^ x; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10, sum = 0;
    for (long i = 0; i < n; i++) {
        sum += wrap_one(i); calls[0]++;
        if (i % 2) { sum += wrap_two(i); calls[1]++; }
        if (i % 3) { sum += keep_one(i); calls[2]++; }
        sum += keep_two(i); calls[3]++;
    }
    printf("wrap_one %ld\nwrap_two %ld\nkeep_one %ld\nkeep_two %ld\nsum %ld\n",
           calls[0], calls[1], calls[2], calls[3], sum);
    return 0;
}
