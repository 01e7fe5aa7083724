/* Many threads fire one USDT probe as fast as they can.
 *
 *   usdt_threads THREADS EVENTS_PER_THREAD
 *
 * Each event carries (thread number, sequence, check = thread * 1000003 + sequence * 7),
 * so a reader can tell a torn or duplicated event from a good one. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

static long per_thread;

static void *run(void *arg) {
    long t = (long)arg;
    for (long k = 0; k < per_thread; k++)
        DTRACE_PROBE3(sample, tick, t, k, t * 1000003 + k * 7);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    per_thread = argc > 2 ? atol(argv[2]) : 100000;
    pthread_t th[64];
    for (long t = 0; t < threads && t < 64; t++)
        pthread_create(&th[t], NULL, run, (void *)t);
    for (int t = 0; t < threads && t < 64; t++)
        pthread_join(th[t], NULL);
    printf("fired %ld\n", threads * per_thread);
    return 0;
}
