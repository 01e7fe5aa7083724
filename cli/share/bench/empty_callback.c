/* `urewrite bench --programs`'s empty C callback (cli/bench/programs.py). */
#include "urewrite.h"

UREWRITE_READS(UREWRITE_ARGS(0)); /* nothing of the context: nothing worked out for it */

void empty(struct urewrite_context *ctx)
{
    (void)ctx;
}
