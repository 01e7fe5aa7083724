/* A server that starts as root, forks workers, and has them switch user, as
 * PostgreSQL's postmaster or nginx's master do: what tests/test_user_switch.py
 * counts under `urewrite stat`.
 *
 *   dropping_server UID GID WORKERS REQUESTS [wait]
 *
 * With "wait", it first prints "ready PID" and waits for a line on stdin (a
 * tracer arms it meanwhile: `urewrite stat -p PID`).
 * The parent (still root) handles REQUESTS requests, forks WORKERS workers, and
 * waits for them. Each worker switches to UID/GID for good (setgroups, setgid,
 * setuid), checks it cannot get root back, then handles REQUESTS requests and one
 * more for each worker before it (so each worker's count differs). The parent
 * then handles REQUESTS more. Entries of handle_request in one run:
 *
 *   2 * REQUESTS + WORKERS * REQUESTS + WORKERS * (WORKERS - 1) / 2
 *
 * Prints "served N" with that figure; exits 0, or 1 when something failed.
 */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noipa))

static volatile long served;

NOINLINE void handle_request(int n) { served += n > 0; }

NOINLINE int drop_privileges(uid_t uid, gid_t gid) {
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
        return -1;
    return setuid(0) == 0 ? -1 : 0; /* no way back */
}

NOINLINE int worker(int index, uid_t uid, gid_t gid, int requests) {
    if (drop_privileges(uid, gid) != 0)
        return 1;
    for (int i = 0; i < requests + index; i++)
        handle_request(1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6)
        return 2;
    if (argc == 6) {
        char line[64];
        printf("ready %ld\n", (long)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 2;
    }
    uid_t uid = (uid_t)atol(argv[1]);
    gid_t gid = (gid_t)atol(argv[2]);
    int workers = atoi(argv[3]), requests = atoi(argv[4]);
    for (int i = 0; i < requests; i++)
        handle_request(1);
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0)
            _exit(worker(w, uid, gid, requests));
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    for (int i = 0; i < requests; i++)
        handle_request(1);
    long total = 2L * requests + (long)workers * requests + (long)workers * (workers - 1) / 2;
    printf("served %ld\n", total);
    return failed;
}
