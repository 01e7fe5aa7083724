/* Threads started one after another, each once the one before it has been joined:
 * glibc gives each the stack, and so the thread control block (the thread pointer), of
 * the one before. Each prints its kernel thread id, then calls work() CALLS times:
 * events and probe programs must name each thread by its own id. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CALLS 3

volatile int sink;

__attribute__((noinline)) void work(int x) { sink = x; }

static void *run(void *arg) {
    printf("thread %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    for (int i = 0; i < CALLS; i++)
        work(i);
    return arg;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, 0, run, 0) != 0 || pthread_join(t, 0) != 0)
            return 1;
    }
    return 0;
}
