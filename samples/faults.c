/* A fault in a function's first instruction, two calls deep: for what gdb and core dumps
   show of a fault in an instruction a rewrite moved (tests/test_debug_view.py).
   `faults` prints the sums of its reads; `faults null` then reads through NULL. */
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) int deref(const int *p) { return *p + 1; }

__attribute__((noinline)) int outer(const int *p, int n) {
    int sum = 0;
    for (int i = 0; i < n; i++)
        sum += deref(p + i);
    return sum;
}

int main(int argc, char **argv) {
    int values[4] = {1, 2, 3, 4};
    printf("%d\n", outer(values, 4));
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "null") == 0)
        printf("%d\n", outer(NULL, 1));
    return 0;
}
