/* Prints the probes of urewrite region files, one line per probe:
 *
 *     <object> <name> <kind> 0x<address> <hits>
 *
 *   read_region FILE.ure...
 *
 * Build: cc -std=c99 -I trampolines samples/read_region.c -o read_region
 * Exit status: 0, or 1 when a file cannot be read or is not a valid region
 * (the other files are still printed), 2 for bad usage. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "urewrite.h"

static int print_region(const char *path)
{
    struct stat st;
    void *base;
    size_t size;
    int fd, rc;
    uint32_t i;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "read_region: %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    if (st.st_size < (off_t)sizeof(struct urewrite_header) || (uintmax_t)st.st_size > SIZE_MAX) {
        fprintf(stderr, "read_region: %s: %s\n", path, urewrite_check_message(UREWRITE_ERR_SIZE));
        close(fd);
        return 1;
    }
    size = (size_t)st.st_size;
    /* MAP_SHARED: a process still running keeps counting into these pages */
    base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        fprintf(stderr, "read_region: %s: %s\n", path, strerror(errno));
        return 1;
    }
    rc = urewrite_check(base, size);
    if (rc != UREWRITE_OK) {
        fprintf(stderr, "read_region: %s: %s\n", path, urewrite_check_message(rc));
        munmap(base, size);
        return 1;
    }
    {
        const struct urewrite_header *hdr = (const struct urewrite_header *)base;
        for (i = 0; i < hdr->probe_count; i++) {
            const struct urewrite_probe *p = urewrite_probe_at(hdr, i);
            const char *kind = urewrite_kind_name(p->kind);
            if (kind != NULL)
                printf("%s %s %s 0x%" PRIx64 " %" PRIu64 "\n", hdr->object,
                       urewrite_probe_name(hdr, i), kind, p->address, urewrite_hits(hdr, i));
            else /* a kind added after this reader: print its number */
                printf("%s %s %" PRIu32 " 0x%" PRIx64 " %" PRIu64 "\n", hdr->object,
                       urewrite_probe_name(hdr, i), p->kind & UREWRITE_KIND_MASK, p->address,
                       urewrite_hits(hdr, i));
        }
    }
    munmap(base, size);
    return 0;
}

int main(int argc, char **argv)
{
    int i, status = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: read_region FILE.ure...\n");
        return 2;
    }
    for (i = 1; i < argc; i++)
        if (print_region(argv[i]) != 0)
            status = 1;
    return status;
}
