/* A probe where the flags are live (x86_64): below(a, b) compares, and the instruction
 * after the compare reads the result from the flags. tests/test_built_in_calls.py
 * probes it there, at below+3, with a program and with C callbacks built in: what a
 * probe runs changes the flags, and its trampoline must give them back. */
#include <stdio.h>
#include <stdlib.h>

long below(long a, long b);
__asm__(".text\n.globl below\n.type below, @function\nbelow:\n"
        "\tcmp %rsi, %rdi\n"   /* 3 bytes: the probe goes after it */
        "\tsetb %al\n"
        "\tmovzbl %al, %eax\n"
        "\tret\n"
        ".size below, .-below\n");

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < n; i++)
        sum += below(i % 7, i % 5) * (i % 11 + 1);
    printf("%ld\n", sum);
    return 0;
}
