/* A C callback for samples/programs/values.c (tests/test_callbacks.py):
 *
 *   urewrite values -p work -r work -p named --args 2 \
 *       --call values_hook.c:on_values -o values.probed
 *
 * It keeps the maps of this bpftrace program, which the test evaluates to compare:
 *
 *   uprobe:values:work { @by_b[arg1] = count(); @sum_a = sum(arg0); }
 *   uretprobe:values:work { @ret = hist((int64)retval); @low = min((int64)retval);
 *       @high = max((int64)retval); @mean = avg((int64)retval);
 *       @lin = lhist((int64)retval, 0, 3000, 500); }
 *
 * and at named(word, i): @letters[word's first letter, i % 2] (the word read with
 * urewrite_read), a read of NULL (a fault, counted: no crash), the probe's own hit
 * count in its area, and for i < 3 an event of (i, that count, whether tid is set);
 * at every probe, @unset: args[2] and args[3], which it reads and no probe records: 0. */
#include "urewrite.h"

UREWRITE_MAP(by_b, UREWRITE_COUNT, 1);
UREWRITE_MAP(sum_a, UREWRITE_SUM, 0);
UREWRITE_MAP(ret, UREWRITE_HIST, 0);
UREWRITE_MAP(low, UREWRITE_MIN, 0);
UREWRITE_MAP(high, UREWRITE_MAX, 0);
UREWRITE_MAP(mean, UREWRITE_AVG, 0);
UREWRITE_LHIST_MAP(lin, 0, 0, 3000, 500);
UREWRITE_MAP(letters, UREWRITE_COUNT, 2);
UREWRITE_MAP(unset, UREWRITE_SUM, 0); /* the arguments no probe records: all 0 */
UREWRITE_READS(UREWRITE_READS_TID | UREWRITE_ARGS(4)); /* (args[2], args[3] read 0) */

static int same(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

void on_values(struct urewrite_context *ctx)
{
    int64_t rest = 0;
    for (int i = 2; i < 4; i++)
        rest |= (int64_t)ctx->args[i];
    urewrite_map_add(ctx, &unset, 0, rest);
    if (same(ctx->name, "work") && ctx->kind == UREWRITE_KIND_RETURN) {
        int64_t r = (int64_t)urewrite_retval(ctx);
        urewrite_map_add(ctx, &ret, 0, r);
        urewrite_map_add(ctx, &low, 0, r);
        urewrite_map_add(ctx, &high, 0, r);
        urewrite_map_add(ctx, &mean, 0, r);
        urewrite_map_add(ctx, &lin, 0, r);
    } else if (same(ctx->name, "work")) {
        urewrite_map_add(ctx, &by_b, ctx->args[1], 0);
        urewrite_map_add(ctx, &sum_a, 0, (int64_t)ctx->args[0]);
    } else if (same(ctx->name, "named")) {
        char word[8];
        uint64_t keys[2], hits;
        if (urewrite_read(ctx, word, ctx->args[0], 2) == 0) {
            keys[0] = (uint8_t)word[0];
            keys[1] = ctx->args[1] % 2;
            urewrite_map_update(ctx, &letters, keys, 0);
        }
        urewrite_read(ctx, word, 0, 1);
        hits = __atomic_add_fetch(&ctx->area[0], 1, __ATOMIC_RELAXED);
        if (ctx->args[1] < 3) {
            uint64_t event[3] = {ctx->args[1], hits, ctx->tid != 0};
            urewrite_emit(ctx, event, 3);
        }
    }
}
