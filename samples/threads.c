/* Threads, all alive at once, each call a noinline function many times.
 *
 *   threads [THREADS [CALLS [STAGGER]]]   default: 4 threads x 300,000 calls; exits 0
 *
 * With STAGGER 1 the threads' stacks have uneven sizes, so their thread pointers
 * are not evenly spaced and hash into urewrite's rows the way unrelated addresses do
 * (evenly spaced ones spread perfectly under its multiplicative hash).
 *
 * Prints the total. Expected entry counts for one run:
 *   work              THREADS x CALLS   (default 1,200,000)
 *   worker            THREADS
 *   main              1
 * A barrier keeps every thread alive until all have started, so that with many
 * threads some share a counter row (urewrite has 256 per-thread rows).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noipa))
#define MAX_THREADS 1024

static pthread_barrier_t barrier;
static long calls = 300000;

NOINLINE long work(long x) { return x ^ (x >> 3); }

NOINLINE void *worker(void *arg) {
    long *total = arg;
    long sum = 0;
    pthread_barrier_wait(&barrier);
    for (long i = 0; i < calls; i++)
        sum += work(i) & 1;
    *total = sum;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        calls = atol(argv[2]);
    int stagger = argc > 3 && atoi(argv[3]);
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    static pthread_t tid[MAX_THREADS];
    static long totals[MAX_THREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        if (stagger)
            pthread_attr_setstacksize(&attr, 64 * 1024 + (size_t)(i * 7919 % 61) * 4096);
        if (pthread_create(&tid[i], &attr, worker, &totals[i]) != 0)
            return 1;
    }
    long sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        sum += totals[i];
    }
    printf("threads=%d calls=%ld odd=%ld\n", threads, (long)threads * calls, sum);
    return 0;
}
