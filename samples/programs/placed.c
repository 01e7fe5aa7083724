/* Where a probe program's code is mapped (tests/test_direct_entries.py): calls
 * `target` N times, then prints where this executable's lowest mapping starts and
 * where the mapping of a probe program's code (a file named *.program) lies, from
 * /proc/self/maps. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) long target(long i)
{
    __asm__ volatile("");
    return i * 3;
}

static unsigned long lowest_of_self(void)
{
    char self[4096], line[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    unsigned long lowest = ~0UL, start, end;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (n < 0 || !maps)
        return 0;
    self[n] = 0;
    while (fgets(line, sizeof line, maps))
        if (strstr(line, self) && sscanf(line, "%lx-%lx", &start, &end) == 2 && start < lowest)
            lowest = start;
    fclose(maps);
    return lowest;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    unsigned long lowest = lowest_of_self(), start, end;
    for (long i = 0; i < n; i++)
        sum += target(i);
    printf("sum %ld\nself %lx\n", sum, lowest);
    char line[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, ".program") && sscanf(line, "%lx-%lx", &start, &end) == 2)
            printf("program %lx %lx\n", start, end);
    return 0;
}
