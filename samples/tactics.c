/* Sites a 5-byte jump cannot take, each forcing one patch tactic (docs/design.md).
 *
 *   tactics [N]      calls each function below a known number of times, prints what
 *                    they returned and how often each was entered and returned
 *
 * Hand-written so that the layout is exact (no endbr64: build with
 * -fcf-protection=none):
 *   tac_hop      a loop branches back to entry+2: only a 2-byte window is safe; the
 *                alignment padding after it holds the landing          -> hop
 *   tac_evict    4 bytes, packed between two 150-byte functions with no padding in
 *                reach: a neighbour window moves to free a landing      -> evict
 *   tac_leave    its exit is `leave; ret` with a branch to the `leave`, and the next
 *                function follows at once: the exit takes a 2-byte hop  -> evict
 *   tac_fill1/2  the neighbours: sums of immediates, so an evicted window that ran
 *                wrong would change what they return
 *   tac_last     a lone `ret`, the last function of .text (its own section sorts
 *                last): the window takes a byte of the gap before .fini -> hop or evict
 *
 * And an exit that is not a return: tac_cond ends in a conditional tail call (`jg
 * tac_evict`, as hand-written code such as glibc's has), one of its exits when taken.
 */
#include <stdio.h>
#include <stdlib.h>

int tac_hop(int n);
int tac_cond(int x);
int tac_evict(int x);
int tac_leave(int x);
int tac_fill1(int x);
int tac_fill2(int x);
void tac_last(void);

#define ADDS30(k) \
    "    .rept 30\n" \
    "    addl $" #k ", %eax\n" \
    "    .endr\n"

__asm__(
    "    .text\n"
    "    .p2align 4\n"
    "    .globl tac_hop\n"
    "    .type tac_hop, @function\n"
    "tac_hop:\n"                        /* 2 * n, for n >= 1 */
    "    xorl %eax, %eax\n"
    "tac_hop_loop:\n"
    "    addl $2, %eax\n"
    "    decl %edi\n"
    "    jg tac_hop_loop\n"
    "    ret\n"
    "    .size tac_hop, .-tac_hop\n"

    "    .p2align 4\n"
    "    .globl tac_cond\n"
    "    .type tac_cond, @function\n"
    "tac_cond:\n"                       /* x > 5 ? tac_evict(x) : x + 1 */
    "    cmpl $5, %edi\n"
    "    jg .Ltac_evict\n"
    "    leal 1(%rdi), %eax\n"
    "    ret\n"
    "    .size tac_cond, .-tac_cond\n"

    "    .p2align 4\n"
    "    .globl tac_fill1\n"
    "    .type tac_fill1, @function\n"
    "tac_fill1:\n"
    "    movl %edi, %eax\n"
    ADDS30(0x10001)
    "    ret\n"
    "    .size tac_fill1, .-tac_fill1\n"

    "    .globl tac_evict\n"
    "    .type tac_evict, @function\n"
    "tac_evict:\n"                      /* x + 1 */
    ".Ltac_evict:\n"                    /* (for a branch that no PLT may take) */
    "    leal 1(%rdi), %eax\n"
    "    ret\n"
    "    .size tac_evict, .-tac_evict\n"

    "    .globl tac_leave\n"
    "    .type tac_leave, @function\n"
    "tac_leave:\n"                      /* x > 0 ? 1 : 0, with a frame */
    "    pushq %rbp\n"
    "    movq %rsp, %rbp\n"
    "    xorl %eax, %eax\n"
    "    testl %edi, %edi\n"
    "    jle tac_leave_out\n"
    "    movl $1, %eax\n"
    "tac_leave_out:\n"
    "    leave\n"
    "    ret\n"
    "    .size tac_leave, .-tac_leave\n"

    "    .globl tac_fill2\n"
    "    .type tac_fill2, @function\n"
    "tac_fill2:\n"
    "    movl %edi, %eax\n"
    ADDS30(0x20002)
    "    ret\n"
    "    .size tac_fill2, .-tac_fill2\n"

    "    .section .text.zzz_last, \"ax\", @progbits\n"
    "    .p2align 4\n"
    "    .globl tac_last\n"
    "    .type tac_last, @function\n"
    "tac_last:\n"
    "    ret\n"
    "    .size tac_last, .-tac_last\n"
    "    .text\n");

#ifndef TACTICS_LIBRARY  /* built as a shared object, the library has no main */
int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    long sum = 0;
    for (int r = 0; r < rounds; r++) {
        for (int n = 1; n <= 3; n++) sum += tac_hop(n);          /* 3 calls */
        for (int x = 0; x < 10; x++) sum += tac_cond(x);          /* 10, 4 go on to tac_evict */
        for (int x = 0; x < 4; x++) sum += tac_evict(x * 10);     /* 4 calls */
        for (int x = -2; x < 3; x++) sum += tac_leave(x);         /* 5 calls, 3 take the branch */
        sum += tac_fill1(1) + tac_fill1(2) + tac_fill2(3);        /* 2 + 1 calls */
        for (int k = 0; k < 6; k++) tac_last();                   /* 6 calls */
    }
    printf("sum %ld\n", sum);
    printf("calls tac_hop %d tac_cond %d tac_evict %d tac_leave %d tac_fill1 %d tac_fill2 %d "
           "tac_last %d\n", 3 * rounds, 10 * rounds, 8 * rounds, 5 * rounds, 2 * rounds, rounds,
           6 * rounds);
    return 0;
}
#endif
