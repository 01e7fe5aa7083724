/* A stand-in for an always-on service, driven by lines on stdin, for the tests of
 * the live views (stat --interval/--dir, top, export). Each command answers
 * "ok COMMAND" once its calls are made, so a test knows the exact counts so far:
 *
 *   call N     handle() N times
 *   nap N      nap() N times; each sleeps NAP_US microseconds
 *   spin S     for S seconds: fast() 10 times and slow() once, then sleep 1 ms
 *   quit       exit 0 (so does end of input)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NAP_US 3000

static volatile long sink;

__attribute__((noinline)) int handle(int x) { sink += x; return x + 1; }
__attribute__((noinline)) void fast(void) { sink++; }
__attribute__((noinline)) void slow(void) { sink--; }

__attribute__((noinline)) void nap(void)
{
    struct timespec ts = {0, NAP_US * 1000L};
    nanosleep(&ts, NULL);
    sink++;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void)
{
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char word[32];
        double n = 0;
        if (sscanf(line, "%31s %lf", word, &n) < 1)
            continue;
        if (!strcmp(word, "call")) {
            for (long i = 0; i < (long)n; i++)
                handle((int)i);
        } else if (!strcmp(word, "nap")) {
            for (long i = 0; i < (long)n; i++)
                nap();
        } else if (!strcmp(word, "spin")) {
            struct timespec ms = {0, 1000000L};
            long rounds = 0;
            for (double end = now() + n; now() < end; rounds++) {
                for (int i = 0; i < 10; i++)
                    fast();
                slow();
                nanosleep(&ms, NULL);
            }
            printf("rounds %ld\n", rounds);
        } else if (!strcmp(word, "quit")) {
            break;
        }
        printf("ok %s", line);
        fflush(stdout);
    }
    return 0;
}
