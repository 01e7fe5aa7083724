/* A long-running multi-threaded process for probe programs loaded while it runs:
 * driven by lines on stdin, it answers "ok LINE" once the calls of a line are made,
 * so a test knows the exact calls made while a program was loaded.
 *
 *   calls T N    T threads each call work(i, t) for i = 0 .. N-1
 *   quit         exit 0 (so does end of input)
 *
 * Before the first line it prints "ready". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile long sink;
static long per_thread;

__attribute__((noinline)) long work(long i, long t) { sink += i; return i * 2 + t; }

static void *caller(void *t)
{
    for (long i = 0; i < per_thread; i++)
        work(i, (long)t);
    return NULL;
}

int main(void)
{
    char line[128];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        long threads = 0;
        if (sscanf(line, "calls %ld %ld", &threads, &per_thread) == 2 && threads > 0 &&
            threads <= 64) {
            pthread_t ids[64];
            for (long t = 0; t < threads; t++)
                pthread_create(&ids[t], NULL, caller, (void *)t);
            for (long t = 0; t < threads; t++)
                pthread_join(ids[t], NULL);
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
        printf("ok %s", line);
        fflush(stdout);
    }
    return 0;
}
