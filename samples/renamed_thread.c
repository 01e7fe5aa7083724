/* A thread that calls work() under one name, renames itself (pthread_setname_np),
 * waits, then calls it under its new name: a probe program's `comm` follows, as
 * bpftrace's does (the tracer compares the names it learnt with the kernel's every
 * 0.1 s: reader/thread_names.py). */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline)) void work(int x) { sink = x; }

static void *run(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "before");
    for (int i = 0; i < 3; i++)
        work(i);
    pthread_setname_np(pthread_self(), "after-rename");
    usleep(500000);
    for (int i = 0; i < 5; i++)
        work(i);
    return 0;
}

int main(void) {
    pthread_t t;
    if (pthread_create(&t, 0, run, 0) != 0 || pthread_join(t, 0) != 0)
        return 1;
    return 0;
}
