/* USDT arguments in every operand form a compiler gives, for probe programs'
 * direct entries (tests/test_direct_entries.py): registers of each width and
 * signedness, constants, stack memory (at -O0), a global (RIP-relative in PIE
 * code, absolute in non-PIE), a thread-local (%fs), and one probe at two sites
 * whose arguments differ (a constant at one, a register at the other).
 * Prints what the probes should have seen. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

long global_word = 1000;
__thread int thread_word = 7;

__attribute__((noinline)) void widths(long n, int i)
{
    signed char c = (signed char)(i - 100);
    unsigned short s = (unsigned short)(i * 300);
    int k = -i;
    unsigned int u = 4000000000u - (unsigned)i;
    STAP_PROBE5(ops, widths, c, s, k, u, n - i);
}

__attribute__((noinline)) void places(int i)
{
    global_word += i;
    thread_word += 1;
    STAP_PROBE4(ops, places, global_word, thread_word, 42, i);
}

__attribute__((noinline)) void reads(void)
{
    STAP_PROBE2(ops, reads, global_word, thread_word);  /* memory operands, as they are */
}

__attribute__((noinline)) void twice(int i)
{
    if (i % 3 == 0)
        STAP_PROBE1(ops, twice, 5);
    else
        STAP_PROBE1(ops, twice, i);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100;
    long sum_c = 0, sum_s = 0, sum_k = 0, sum_u = 0, sum_d = 0, sum_g = 0, sum_t = 0;
    long sum_twice = 0, sum_rg = 0, sum_rt = 0;
    for (int i = 0; i < n; i++) {
        widths(n, i);
        sum_c += (signed char)(i - 100);
        sum_s += (unsigned short)(i * 300);
        sum_k += -i;
        sum_u += 4000000000u - (unsigned)i;
        sum_d += n - i;
        places(i);
        sum_g += global_word;
        sum_t += thread_word;
        reads();
        sum_rg += global_word;
        sum_rt += thread_word;
        twice(i);
        sum_twice += i % 3 == 0 ? 5 : i;
    }
    printf("@c: %ld\n@d: %ld\n@g: %ld\n@k: %ld\n@rg: %ld\n@rt: %ld\n@s: %ld\n@t: %ld\n"
           "@twice: %ld\n@u: %ld\n", sum_c, sum_d, sum_g, sum_k, sum_rg, sum_rt, sum_s, sum_t,
           sum_twice, sum_u);
    return 0;
}
