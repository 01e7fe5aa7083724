/* Bytes that two x86 decoders read differently: 67 0f b9 40 16 is `ud1 eax,
 * [eax+0x16]` (5 bytes) to iced-x86, which sweeps functions, and 3 bytes to Capstone 5,
 * which decodes what a window displaces. A window holding them must be refused, in
 * `list` as in a rewrite; a window that ends at the `ret` before them is fine. Never run. */
#include <stdio.h>

/* room before its ret for a window that ends there: its exit is patched */
int ud1_after_ret(int x);
/* none: every window around its ret holds the ud1, so its return address is redirected */
int ud1_tight(int x);

__asm__(".text\n"
        ".globl ud1_after_ret\n.type ud1_after_ret, @function\n"
        "ud1_after_ret:\n"
        "  push %rbx\n  mov %edi, %eax\n  add $1, %eax\n  pop %rbx\n  ret\n"
        "  .byte 0x67, 0x0f, 0xb9, 0x40, 0x16\n"
        ".size ud1_after_ret, .-ud1_after_ret\n"
        ".globl ud1_tight\n.type ud1_tight, @function\n"
        "ud1_tight:\n"
        "  mov %edi, %eax\n  ret\n"
        "  .byte 0x67, 0x0f, 0xb9, 0x40, 0x16\n"
        ".size ud1_tight, .-ud1_tight\n");

int main(void)
{
    int sum = 0;
    for (int i = 0; i < 6; i++)
        sum += ud1_after_ret(i) + ud1_tight(i);
    printf("%d\n", sum);
    return 0;
}
