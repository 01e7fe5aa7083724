/* The C callbacks of `urewrite bench --programs` (cli/bench/programs.py). */
#include "urewrite.h"

UREWRITE_MAP(keyed, UREWRITE_COUNT, 1);
UREWRITE_READS(0);

void empty(struct urewrite_context *ctx)
{
    (void)ctx;
}

/* @keyed[arg0 % 1000] = count() */
void keyed_count(struct urewrite_context *ctx)
{
    urewrite_map_add(ctx, &keyed, ctx->args[0] % 1000, 0);
}
