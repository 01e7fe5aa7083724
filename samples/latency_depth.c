/* Recursion deeper than a thread's stack of open calls (126) holds: with
 * `-p descend -r descend`, each of THREADS threads makes ROUNDS descents of
 * DEPTH nested calls of descend (DEPTH x ROUNDS x THREADS calls); the 126
 * outermost open calls of each descent give latency samples, the deeper ones
 * none, and are counted as such.
 *
 * usage: latency_depth DEPTH ROUNDS THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int depth, rounds;
static volatile int sink;

__attribute__((noinline, noipa)) int descend(int n)
{
    if (n <= 1)
        return 1;
    int below = descend(n - 1); /* no tail call, no loop: every call stays open */
    sink = below;
    return below + 1;
}

static void *worker(void *arg)
{
    long sum = 0;
    for (int r = 0; r < rounds; r++)
        sum += descend(depth);
    *(long *)arg = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    depth = atoi(argv[1]);
    rounds = atoi(argv[2]);
    int threads = atoi(argv[3]);
    pthread_t tid[64];
    long sums[64];
    if (threads < 1 || threads > 64)
        return 2;
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, worker, &sums[t]);
    long total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        total += sums[t];
    }
    printf("calls=%ld\n", total);
    return 0;
}
