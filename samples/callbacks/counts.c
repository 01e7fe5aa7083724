/* A C callback for samples/programs/values.c (README, "C callbacks"):
 *
 *   urewrite values -p work -r work --args 2 --call counts.c:on_work -o values.probed
 *   urewrite stat -- ./values.probed 700
 *
 * @calls[b]: work(a, b)'s calls by b; @returned: a histogram of what it returned;
 * each probe's own area counts its hits (a callback's state: its code is read-only). */
#include "urewrite.h"

UREWRITE_MAP(calls, UREWRITE_COUNT, 1);
UREWRITE_MAP(returned, UREWRITE_HIST, 0);
UREWRITE_READS(UREWRITE_ARGS(2)); /* args[0], args[1] (a return: its value); no tid, nsecs, comm */

void on_work(struct urewrite_context *ctx)
{
    __atomic_fetch_add(&ctx->area[0], 1, __ATOMIC_RELAXED);
    if (ctx->kind == UREWRITE_KIND_RETURN)
        urewrite_map_add(ctx, &returned, 0, (int64_t)urewrite_retval(ctx));
    else
        urewrite_map_add(ctx, &calls, ctx->args[1], 0);
}
