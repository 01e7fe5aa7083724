/* A C callback (urewrite IN -p ... --call sizes.c:on_hit -o OUT): counts each
 * probe's hits by its first argument, sums the arguments, and keeps a histogram
 * of the return values; the probe's area holds its own hit count. */
#include "urewrite.h"

UREWRITE_MAP(hits, UREWRITE_COUNT, 1);
UREWRITE_MAP(total, UREWRITE_SUM, 1);
UREWRITE_MAP(returned, UREWRITE_HIST, 0);
UREWRITE_READS(0);

void on_hit(struct urewrite_context *ctx)
{
    __atomic_fetch_add(&ctx->area[0], 1, __ATOMIC_RELAXED);
    if (ctx->kind == UREWRITE_KIND_RETURN) {
        urewrite_map_add(ctx, &returned, 0, (int64_t)urewrite_retval(ctx));
        return;
    }
    urewrite_map_add(ctx, &hits, ctx->args[0], 0);
    urewrite_map_add(ctx, &total, ctx->probe, (int64_t)ctx->args[0]);
}
