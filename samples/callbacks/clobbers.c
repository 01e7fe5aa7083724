/* Callbacks for tests/test_callbacks.py's six.c: each writes some of r8 to r11 (the
 * registers a probe's direct entry saves only where the callback's code touches them)
 * and counts its hits; `counts` only counts (with whatever registers its compiler
 * chooses for the map's lookup). */
#include "urewrite.h"

UREWRITE_MAP(hits, UREWRITE_COUNT, 0);
UREWRITE_READS(UREWRITE_ARGS(0));

void counts(struct urewrite_context *ctx)
{
    urewrite_map_add(ctx, &hits, 0, 1);
}

void writes_r8_r9(struct urewrite_context *ctx)
{
#if defined(__x86_64__)
    __asm__ volatile("mov $-1, %%r8\n\tmov $-1, %%r9" ::: "r8", "r9");
#endif
    urewrite_map_add(ctx, &hits, 0, 1);
}

static __attribute__((noinline)) void scribble(void)
{
#if defined(__x86_64__)
    __asm__ volatile("mov $-1, %%r10d\n\tmov $-1, %%r11w" ::: "r10", "r11");
#endif
}

void calls_one_that_writes_r10_r11(struct urewrite_context *ctx)
{
    scribble();
    urewrite_map_add(ctx, &hits, 0, 1);
}
