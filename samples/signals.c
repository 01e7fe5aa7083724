/* Probed functions run from signal handlers, then the program ends itself with SIGTERM.
 *
 *   signals            never returns normally: dies of SIGTERM (shell status 143)
 *
 * Expected entry counts:
 *   before_signal     4
 *   on_usr1           5    SIGUSR1 handler, raised 5 times
 *   in_handler        5    called by the handler
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile sig_atomic_t handled;

NOINLINE void in_handler(int sig) { handled += sig == SIGUSR1; }
NOINLINE void on_usr1(int sig) { in_handler(sig); }
NOINLINE int before_signal(int x) { return x * 3 + handled; }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    int sum = 0;
    for (int i = 0; i < 4; i++)
        sum += before_signal(i);
    for (int i = 0; i < 5; i++)
        raise(SIGUSR1);
    printf("sum=%d handled=%d\n", sum, (int)handled);
    fflush(stdout);
    raise(SIGTERM);
    return 0;
}
