/* A stand-in for V8's embedded builtins (docs/design.md, "Code the program copies"):
 * position-independent functions between the symbol v8_Default_embedded_blob_code_
 * and that address plus v8_Default_embedded_blob_code_size_, which main copies into
 * fresh executable memory and runs from there, as V8 does with its builtins.
 * A patch inside them would travel with the copy and jump from it into nothing.
 *
 * usage: copied_code N   prints the sums of calls through the original and the copy
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#define BLOB_CODE                                                             \
    "Builtins_Twice:\n"     /* 2x + 1, 8 bytes: room for a plain jump */     \
    "    mov %edi, %eax\n"                                                   \
    "    add %eax, %eax\n"                                                   \
    "    add $1, %eax\n"                                                     \
    "    ret\n"                                                              \
    "Builtins_Square:\n"    /* x * x + 3 */                                  \
    "    mov %edi, %eax\n"                                                   \
    "    imul %edi, %eax\n"                                                  \
    "    add $3, %eax\n"                                                     \
    "    ret\n"
#define FUNCTION_TYPE "@function"
#elif defined(__aarch64__)
#define BLOB_CODE                                                             \
    "Builtins_Twice:\n"                                                      \
    "    add w0, w0, w0\n"                                                   \
    "    add w0, w0, #1\n"                                                   \
    "    ret\n"                                                              \
    "Builtins_Square:\n"                                                     \
    "    mul w0, w0, w0\n"                                                   \
    "    add w0, w0, #3\n"                                                   \
    "    ret\n"
#define FUNCTION_TYPE "%function"
#endif

__asm__(".text\n"
        ".p2align 6\n"
        ".globl v8_Default_embedded_blob_code_\n"
        /* global: arm64 GOT entries of local symbols lose their offset in .text */
        ".globl Builtins_Twice\n"
        ".globl Builtins_Square\n"
        ".type Builtins_Twice, " FUNCTION_TYPE "\n"
        ".type Builtins_Square, " FUNCTION_TYPE "\n"
        "v8_Default_embedded_blob_code_:\n"
        BLOB_CODE
        "blob_end:\n"
        ".size Builtins_Twice, Builtins_Square - Builtins_Twice\n"
        ".size Builtins_Square, blob_end - Builtins_Square\n"
        ".section .rodata\n"
        ".p2align 2\n"
        ".globl v8_Default_embedded_blob_code_size_\n"
        "v8_Default_embedded_blob_code_size_:\n"
        "    .long blob_end - v8_Default_embedded_blob_code_\n"
        ".text\n");

extern const char v8_Default_embedded_blob_code_[];
extern const uint32_t v8_Default_embedded_blob_code_size_;
int Builtins_Twice(int);
int Builtins_Square(int);

__attribute__((noinline)) int plain(int x) { return x * 5 - 1; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    size_t size = v8_Default_embedded_blob_code_size_;
    char *copy = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memcpy(copy, v8_Default_embedded_blob_code_, size);
    __builtin___clear_cache(copy, copy + size);
    int (*twice)(int) = (int (*)(int))(copy + ((const char *)Builtins_Twice -
                                               v8_Default_embedded_blob_code_));
    int (*square)(int) = (int (*)(int))(copy + ((const char *)Builtins_Square -
                                                v8_Default_embedded_blob_code_));
    long original = 0, copied = 0;
    for (int i = 0; i < n; i++) {
        original += Builtins_Twice(i) + Builtins_Square(i) + plain(i);
        copied += twice(i) + square(i);
    }
    printf("original %ld copied %ld\n", original, copied);
    return 0;
}
