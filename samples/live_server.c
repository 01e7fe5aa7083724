/* A multi-threaded server for live arming (tests/test_live.py): it runs without
 * UREWRITE_DIR, does work only when told, and keeps its own accounting.
 *
 *   live_server [THREADS]        default 4 worker threads; reads commands on stdin:
 *     work N    N requests, shared by the workers (each: handle_request, which calls
 *               live_step in liblive.so); prints "done N TOTAL" when all are answered,
 *               TOTAL being the requests answered since start
 *     ping      prints "pong"
 *     fork N    a child process answers N requests, then exits; prints "forked N"
 *     enabled   prints "enabled S", S the semaphore of the USDT probe live:batch (-1
 *               without <sys/sdt.h>): 0 unless someone listens
 *     exit      exits 0
 *
 * Expected counts for a window holding the commands "work A", "work B":
 *   handle_request   A + B  (entry, and with -r, return)
 *   live_step        A + B
 *   usdt:live:batch  2
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noipa))

#if __has_include(<sys/sdt.h>)
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
unsigned short live_batch_semaphore __attribute__((section(".probes")));
#define BATCH_PROBE(n) DTRACE_PROBE1(live, batch, n)
#define SEMAPHORE ((int)live_batch_semaphore)
#else
#define BATCH_PROBE(n) ((void)(n))
#define SEMAPHORE (-1)
#endif

long live_step(long x);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
static long batch_end, next_request, answered, total;
static volatile long sink;

NOINLINE long handle_request(long i) { return live_step(i) + 1; }

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (next_request >= batch_end)
            pthread_cond_wait(&wake, &lock);
        long i = next_request++;
        pthread_mutex_unlock(&lock);
        sink = handle_request(i);
        pthread_mutex_lock(&lock);
        if (++answered == batch_end)
            pthread_cond_signal(&finished);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void run_batch(long n) {
    BATCH_PROBE(n);
    pthread_mutex_lock(&lock);
    batch_end += n;
    pthread_cond_broadcast(&wake);
    while (answered < batch_end)
        pthread_cond_wait(&finished, &lock);
    total += n;
    pthread_mutex_unlock(&lock);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int t = 0; t < threads; t++) {
        pthread_t id;
        if (pthread_create(&id, NULL, worker, NULL) != 0)
            return 2;
    }
    char line[128];
    long n;
    printf("ready %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "work %ld", &n) == 1) {
            run_batch(n);
            printf("done %ld %ld\n", n, total);
        } else if (strncmp(line, "ping", 4) == 0) {
            printf("pong\n");
        } else if (sscanf(line, "fork %ld", &n) == 1) {
            pid_t child = fork();
            if (child == 0) {  /* only this thread lives on in the child */
                for (long i = 0; i < n; i++)
                    sink = handle_request(i);
                _exit(0);
            }
            waitpid(child, NULL, 0);
            printf("forked %ld\n", n);
        } else if (strncmp(line, "enabled", 7) == 0) {
            printf("enabled %d\n", SEMAPHORE);
        } else if (strncmp(line, "exit", 4) == 0) {
            return 0;
        }
    }
    return 0;
}
