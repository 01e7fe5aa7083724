/* Bad pointers for probe programs: reads(p, kind) is called with a pointer a program
 * may read (str(), *(type *)p), of each kind, N rounds:
 *   0  a string                                 "hello"
 *   1  NULL
 *   2  a page just unmapped
 *   3  memory freed (a block large enough that free() gives it back to the kernel)
 *   4  a guard page (PROT_NONE)
 *   5  a string that ends 3 bytes before an unmapped page   "hi"
 *
 *   pointers N    prints "readable R unreadable U": the calls of each sort */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) void reads(const char *p, long kind) {
    __asm__ volatile("" : : "r"(p), "r"(kind));  /* keeps both arguments live */
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 10, readable = 0, unreadable = 0;
    long page = sysconf(_SC_PAGESIZE);
    mallopt(M_MMAP_THRESHOLD, 1 << 20);  /* fixed: a freed large block is always unmapped */
    char *pages = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED)
        return 1;
    strcpy(pages + page - 3, "hi");
    munmap(pages + page, page);                    /* page 1: unmapped */
    mprotect(pages + 2 * page, page, PROT_NONE);   /* page 2: a guard page */
    for (long i = 0; i < rounds; i++) {
        char *freed = malloc(1 << 22);
        free(freed);
        const char *kinds[] = {"hello", NULL, pages + page + 16, freed, pages + 2 * page,
                               pages + page - 3};
        for (long k = 0; k < 6; k++) {
            reads(kinds[k], k);
            if (k == 0 || k == 5)
                readable++;
            else
                unreadable++;
        }
    }
    printf("readable %ld unreadable %ld\n", readable, unreadable);
    return 0;
}
