/* Threads that name themselves (pthread_setname_np), then call work(): thread i makes
 * 3 + i calls. With an argument, one more thread, "worker-7", starts after the others
 * are joined, in the stack and thread control block of one of them (glibc reuses them).
 * A probe program's `comm` is each thread's own name, as bpftrace gives it, and its
 * `tid` each thread's own id, which each thread prints ("thread NAME TID"). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline)) void work(int x) { sink = x; }

static void *run(void *arg) {
    long i = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", i);
    pthread_setname_np(pthread_self(), name);
    printf("thread %s %ld\n", name, (long)syscall(SYS_gettid));
    fflush(stdout);
    for (long k = 0; k < 3 + i; k++)
        work((int)k);
    return 0;
}

int main(int argc, char **argv) {
    (void)argv;
    pthread_t t[3];
    for (long i = 0; i < 3; i++)
        if (pthread_create(&t[i], 0, run, (void *)i) != 0)
            return 1;
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], 0);
    if (argc > 1) {
        pthread_t late;
        if (pthread_create(&late, 0, run, (void *)7) != 0 || pthread_join(late, 0) != 0)
            return 1;
    }
    return 0;
}
