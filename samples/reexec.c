/* Executes itself again: one process id runs the program twice, as two images.
 *
 *   reexec             prints a line per image; exits with status 4
 *
 * Expected entry counts, summed over both images:
 *   main              2
 *   hop               5    2 in the first image, 3 in the second
 * Each image writes a region of its own (the second gets a "-1" suffix).
 */
#include <stdio.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile int sink;

NOINLINE void hop(int n) { sink += n; }

int main(int argc, char **argv) {
    if (argc < 2) {
        hop(1);
        hop(2);
        printf("first image sink=%d\n", sink);
        fflush(stdout);
        execl("/proc/self/exe", argv[0], "again", (char *)NULL);
        perror("execl");
        return 1;
    }
    for (int i = 0; i < 3; i++)
        hop(i);
    printf("second image sink=%d\n", sink);
    return 4;
}
