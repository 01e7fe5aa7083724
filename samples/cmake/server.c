/* A stand-in server for the build-system samples (CMake and Bazel): handles N requests (argument 1, default 10).
 * Request i calls parse_header once, parse_body when i is odd, parse_trailer when i % 3 == 0,
 * so hits are exactly: handle_request N, parse_header N, parse_body N/2, parse_trailer (N+2)/3;
 * parse_header returns N times; the USDT probe server:request fires N times.
 * noinline/noclone keep each function a symbol of its own at any optimisation level. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

#define PROBED __attribute__((noinline, noclone))

static volatile unsigned long sink;

PROBED unsigned long parse_header(unsigned long i) {
    unsigned long h = i * 2654435761u;
    for (int k = 0; k < 3; k++)
        h ^= h >> 7, h += k;
    sink += h;
    return h & 0xff;
}

PROBED unsigned long parse_body(unsigned long i) {
    unsigned long b = 0;
    for (unsigned long k = 0; k <= i % 5; k++)
        b = b * 31 + k + i;
    sink += b;
    return b & 0xff;
}

PROBED unsigned long parse_trailer(unsigned long i) {
    sink += i;
    return (i * 7) & 0xff;
}

PROBED unsigned long handle_request(unsigned long i) {
    DTRACE_PROBE1(server, request, i);
    unsigned long r = parse_header(i);
    if (i % 2)
        r += parse_body(i);
    if (i % 3 == 0)
        r += parse_trailer(i);
    sink += r;
    return r;
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 10;
    unsigned long total = 0;
    for (unsigned long i = 0; i < n; i++)
        total += handle_request(i);
    printf("handled %lu requests, checksum %lu\n", n, total);
    return 0;
}
