/* Hand-written functions whose first bytes are hard to relocate (or must be refused).
 *
 *   edges              prints what each function returned; exits with status 0
 *
 * Build without -fcf-protection: the functions below start exactly as written
 * (no endbr64). Every asm function has .type/.size except edge_nosize, whose
 * size is left unknown on purpose.
 *
 * Must be probed and still run correctly; entry counts for one run:
 *   edge_rip_load     3    first: movl edge_counter(%rip), %eax (RIP-relative load)
 *   edge_rip_store    4    first: movl %edi, edge_last(%rip) (RIP-relative store)
 *   edge_jrcxz        5    jrcxz within the first 5 bytes (both ways taken)
 *   edge_loop         6    loop within the first 5 bytes (both ways taken)
 *   edge_jcc          7    short jz within the first 5 bytes (both ways taken)
 *   edge_call         2    push %rbx; call edge_callee: the call is the last displaced instruction
 *   edge_callee       2    C: checks that its return address lies inside edge_call
 *   edge_tiny         8    3 bytes long, followed by nop alignment padding
 *   edge_after_one    10   follows edge_one without padding
 *   edge_mid          11   its instruction at edge_mid_body (mid-function) runs 11 times too
 *   edge_cb           4    C: called through edge_indcall
 *   main              1
 *
 * Too tight for the 5-byte jump; patched with a 2-byte hop to a landing nearby:
 *   edge_backloop     3    a loop branches back to entry+2, inside a 5-byte window
 *   edge_indcall      4    call *%rdi must be the last displaced instruction
 *   edge_sum          3    its loop branches back to entry+2 (its loop head is edge_sum_loop)
 *   edge_nosize       2    no .size and no CFI: it extends to the next symbol
 *
 * Must be refused; they run (except edge_xbegin) and behave as before:
 *   edge_one          9    1 byte long, edge_after_one follows without padding
 *   edge_xbegin       0    xbegin at the entry (never run: the CPU may lack RTM)
 *
 * Loops that stay inside a displaced window:
 *   edge_spin         2 calls, 10 executions of its first instruction (n = 4, 6):
 *                     a loop branches back to the entry itself
 *   edge_sum_loop     35 executions (n = 5, 10, 20): the loop head inside edge_sum
 */
#include <stdio.h>

#define NOINLINE __attribute__((noinline, noipa))

int edge_counter __attribute__((used));
int edge_last __attribute__((used));
int edge_ra_ok;
long edge_ra_offset;

extern char edge_call[], edge_call_end[];

int edge_rip_load(void);
int edge_rip_store(int);
long edge_jrcxz(long);
int edge_loop(int);
int edge_jcc(int);
void edge_call_fn(void) __asm__("edge_call");
int edge_tiny(int);
void edge_one(void);
int edge_after_one(int);
int edge_backloop(int);
int edge_indcall(int (*)(void));
int edge_xbegin(void);
int edge_nosize(void);
int edge_mid(int);
int edge_sum(int);
int edge_spin(int);

NOINLINE void edge_callee(void) {
    char *ra = __builtin_return_address(0);
    edge_ra_ok = ra > edge_call && ra < edge_call_end;
    edge_ra_offset = ra - edge_call;
}

NOINLINE int edge_cb(void) { return 41; }

__asm__(
    "    .text\n"

    "    .p2align 4\n"
    "    .globl edge_rip_load\n"
    "    .type edge_rip_load, @function\n"
    "edge_rip_load:\n"
    "    movl edge_counter(%rip), %eax\n"
    "    addl $1, %eax\n"
    "    movl %eax, edge_counter(%rip)\n"
    "    ret\n"
    "    .size edge_rip_load, .-edge_rip_load\n"

    "    .p2align 4\n"
    "    .globl edge_rip_store\n"
    "    .type edge_rip_store, @function\n"
    "edge_rip_store:\n"
    "    movl %edi, edge_last(%rip)\n"
    "    leal 1(%rdi), %eax\n"
    "    ret\n"
    "    .size edge_rip_store, .-edge_rip_store\n"

    "    .p2align 4\n"
    "    .globl edge_jrcxz\n"
    "    .type edge_jrcxz, @function\n"
    "edge_jrcxz:\n"
    "    movq %rdi, %rcx\n"
    "    jrcxz 1f\n"
    "    leaq 10(%rdi), %rax\n"
    "    ret\n"
    "1:  movq $-1, %rax\n"
    "    ret\n"
    "    .size edge_jrcxz, .-edge_jrcxz\n"

    "    .p2align 4\n"
    "    .globl edge_loop\n"
    "    .type edge_loop, @function\n"
    "edge_loop:\n"
    "    movl %edi, %ecx\n"
    "    xorl %eax, %eax\n"
    "    loop 1f\n"
    "    movl $5, %eax\n"
    "    ret\n"
    "1:  leal (%rcx,%rcx), %eax\n"
    "    ret\n"
    "    .size edge_loop, .-edge_loop\n"

    "    .p2align 4\n"
    "    .globl edge_jcc\n"
    "    .type edge_jcc, @function\n"
    "edge_jcc:\n"
    "    testl %edi, %edi\n"
    "    jz 1f\n"
    "    leal 1(%rdi), %eax\n"
    "    ret\n"
    "1:  movl $-1, %eax\n"
    "    ret\n"
    "    .size edge_jcc, .-edge_jcc\n"

    "    .p2align 4\n"
    "    .globl edge_call\n"
    "    .type edge_call, @function\n"
    "edge_call:\n"
    "    pushq %rbx\n"
    "    call edge_callee\n"
    "    popq %rbx\n"
    "    ret\n"
    "    .globl edge_call_end\n"
    "edge_call_end:\n"
    "    .size edge_call, .-edge_call\n"

    "    .p2align 4\n"
    "    .globl edge_tiny\n"
    "    .type edge_tiny, @function\n"
    "edge_tiny:\n"
    "    movl %edi, %eax\n"
    "    ret\n"
    "    .size edge_tiny, .-edge_tiny\n"

    /* no padding between these two */
    "    .p2align 4\n"
    "    .globl edge_one\n"
    "    .type edge_one, @function\n"
    "edge_one:\n"
    "    ret\n"
    "    .size edge_one, .-edge_one\n"
    "    .p2align 0\n"
    "    .globl edge_after_one\n"
    "    .type edge_after_one, @function\n"
    "edge_after_one:\n"
    "    leal 2(%rdi), %eax\n"
    "    ret\n"
    "    .size edge_after_one, .-edge_after_one\n"

    "    .p2align 4\n"
    "    .globl edge_backloop\n"
    "    .type edge_backloop, @function\n"
    "edge_backloop:\n"
    "    xorl %eax, %eax\n"
    "1:  addl $3, %eax\n"
    "    decl %edi\n"
    "    jnz 1b\n"
    "    ret\n"
    "    .size edge_backloop, .-edge_backloop\n"

    "    .p2align 4\n"
    "    .globl edge_indcall\n"
    "    .type edge_indcall, @function\n"
    "edge_indcall:\n"
    "    pushq %rbx\n"
    "    call *%rdi\n"
    "    popq %rbx\n"
    "    addl $1, %eax\n"
    "    ret\n"
    "    .size edge_indcall, .-edge_indcall\n"

    "    .p2align 4\n"
    "    .globl edge_xbegin\n"
    "    .type edge_xbegin, @function\n"
    "edge_xbegin:\n"
    "    xbegin 1f\n"
    "    xend\n"
    "    movl $1, %eax\n"
    "    ret\n"
    "1:  xorl %eax, %eax\n"
    "    ret\n"
    "    .size edge_xbegin, .-edge_xbegin\n"

    "    .p2align 4\n"
    "    .globl edge_mid\n"
    "    .type edge_mid, @function\n"
    "edge_mid:\n"
    "    leal 1(%rdi), %eax\n"
    "    addl %eax, %eax\n"
    "    .globl edge_mid_body\n"
    "edge_mid_body:\n"
    "    imull $3, %eax, %eax\n"
    "    subl $1, %eax\n"
    "    ret\n"
    "    .size edge_mid, .-edge_mid\n"

    "    .p2align 4\n"
    "    .globl edge_sum\n"
    "    .type edge_sum, @function\n"
    "edge_sum:\n"
    "    xorl %eax, %eax\n"
    "    .globl edge_sum_loop\n"
    "edge_sum_loop:\n"
    "    addl %edi, %eax\n"
    "    decl %edi\n"
    "    jnz edge_sum_loop\n"
    "    ret\n"
    "    .size edge_sum, .-edge_sum\n"

    "    .p2align 4\n"
    "    .globl edge_spin\n"
    "    .type edge_spin, @function\n"
    "edge_spin:\n"
    "    decl %edi\n"
    "    jnz edge_spin\n"
    "    movl %edi, %eax\n"
    "    ret\n"
    "    .size edge_spin, .-edge_spin\n"

    /* deliberately no .size */
    "    .p2align 4\n"
    "    .globl edge_nosize\n"
    "    .type edge_nosize, @function\n"
    "edge_nosize:\n"
    "    movl $7, %eax\n"
    "    ret\n"

    "    .p2align 4\n");

int main(void) {
    int v = 0;
    for (int i = 0; i < 3; i++)
        v = edge_rip_load();
    printf("rip_load=%d counter=%d\n", v, edge_counter);

    int s = 0;
    for (int i = 0; i < 4; i++)
        s += edge_rip_store(i * 10);
    printf("rip_store=%d last=%d\n", s, edge_last);

    for (long i = 0; i < 5; i++)
        printf("jrcxz(%ld)=%ld\n", i, edge_jrcxz(i));
    for (int i = 1; i <= 6; i++)
        printf("loop(%d)=%d\n", i, edge_loop(i));
    for (int i = -3; i <= 3; i++)
        printf("jcc(%d)=%d\n", i, edge_jcc(i));

    for (int i = 0; i < 2; i++) {
        edge_ra_ok = 0;
        edge_call_fn();
        printf("call: ra_ok=%d ra_offset=%ld\n", edge_ra_ok, edge_ra_offset);
    }

    int t = 0;
    for (int i = 0; i < 8; i++)
        t += edge_tiny(i);
    printf("tiny=%d\n", t);
    for (int i = 0; i < 9; i++)
        edge_one();
    int a = 0;
    for (int i = 0; i < 10; i++)
        a += edge_after_one(i);
    printf("after_one=%d\n", a);

    for (int i = 1; i <= 3; i++)
        printf("backloop(%d)=%d\n", i, edge_backloop(i));
    for (int i = 0; i < 4; i++)
        printf("indcall=%d\n", edge_indcall(edge_cb));
    for (int i = 0; i < 2; i++)
        printf("nosize=%d\n", edge_nosize());
    int m = 0;
    for (int i = 0; i < 11; i++)
        m += edge_mid(i);
    printf("mid=%d\n", m);
    printf("sum=%d,%d,%d\n", edge_sum(5), edge_sum(10), edge_sum(20));
    printf("spin=%d,%d\n", edge_spin(4), edge_spin(6));
    return 0;
}
