/* A function whose bytes hold one that decodes as no instruction (0x06, push es, invalid
 * in 64-bit mode), jumped over: a linear sweep stops there, so the exits after it are
 * unseen, and its return probe must be refused rather than miss returns. */
#include <stdio.h>

__attribute__((noinline)) int hidden_exits(int x)
{
    __asm__ volatile("jmp 1f\n\t.byte 0x06\n1:");
    if (x > 3)
        return x * 2;
    return x + 1;
}

int main(void)
{
    int sum = 0;
    for (int i = 0; i < 8; i++)
        sum += hidden_exits(i);
    printf("%d\n", sum);
    return 0;
}
