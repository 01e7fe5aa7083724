/* Coroutines switched with ucontext (getcontext, makecontext, swapcontext): stack
 * switching the rewriter must notice (tests/test_redirect.py, test_aarch64_redirect.py). */
#include <ucontext.h>
static ucontext_t main_ctx, co_ctx;
static char co_stack[64 * 1024];
static void (*body)(void);
static void run(void) { body(); }
void co_start(void (*f)(void)) {
    body = f;
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = co_stack;
    co_ctx.uc_stack.ss_size = sizeof co_stack;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, run, 0);
}
void co_resume(void) { swapcontext(&main_ctx, &co_ctx); }
void co_yield(void) { swapcontext(&co_ctx, &main_ctx); }
