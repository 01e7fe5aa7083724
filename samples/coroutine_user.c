/* Runs samples/coroutines.c's coroutine: a probed function suspended on the
 * coroutine's stack and resumed later (tests/test_redirect.py, test_aarch64_redirect.py). */
#include <stdio.h>
void co_start(void (*)(void)), co_resume(void), co_yield(void);
static volatile int sink;
/* entered on the coroutine's stack, suspended there, resumed later */
__attribute__((noipa)) int inner(int x) {
    if (x < 0)
        return 0;
    co_yield();
    return x + sink;
}
static void coroutine(void) { inner(1); }
/* returns while inner, entered after it on this thread, is suspended */
__attribute__((noipa)) int outer(int x) {
    if (x < 0)
        return 0;
    co_resume();
    return x + sink;
}
int main(void) {
    co_start(coroutine);
    outer(1);
    co_resume();
    puts("done");
    return 0;
}
