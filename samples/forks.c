/* The parent and a forked child both call probed functions.
 *
 *   forks              prints what each process did; exits with status 0
 *
 * Expected entry counts, summed over both processes:
 *   tick              21   3 before fork() (parent), 7 in the child, 11 in the parent after
 *   child_only        1
 *   parent_only       2
 * Each process ends with at least one hit, so a run leaves one region per process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile long sink;

NOINLINE void tick(int n) { sink += n; }
NOINLINE void child_only(void) { sink += 100; }
NOINLINE void parent_only(void) { sink += 1000; }

int main(void) {
    for (int i = 0; i < 3; i++)
        tick(i);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        for (int i = 0; i < 7; i++)
            tick(i);
        child_only();
        printf("child sink=%ld\n", sink);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 2;
    for (int i = 0; i < 11; i++)
        tick(i);
    parent_only();
    parent_only();
    printf("parent sink=%ld\n", sink);
    return 0;
}
