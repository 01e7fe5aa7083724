/* A function that never returns: a return probe on it has nothing to patch. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline, noreturn)) void die(int code) {
    printf("dying %d\n", code);
    exit(code);
}

int main(int argc, char **argv) {
    if (argc > 1)
        die(4);
    puts("alive");
    return 0;
}
