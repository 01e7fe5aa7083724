/* `urewrite bench --programs`'s C callback that counts by a key: @keyed[arg0 % 1000]. */
#include "urewrite.h"

UREWRITE_MAP(keyed, UREWRITE_COUNT, 1);
UREWRITE_READS(UREWRITE_ARGS(1));

void keyed_count(struct urewrite_context *ctx)
{
    urewrite_map_add(ctx, &keyed, ctx->args[0] % 1000, 0);
}
