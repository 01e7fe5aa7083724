/* AArch64 functions whose first instruction is hard to relocate (or must be refused).
 *
 *   edges              prints what each function returned; exits with status 0
 *
 * Build with aarch64-linux-gnu-gcc at any -O level, as PIE, -no-pie or -static,
 * with or without -mbranch-protection=standard. As a shared library, build it
 * with -fPIC -Dmain=edges_main and call edges_main() from a program.
 *
 * The asm functions below start with the instruction named (after a `bti c`
 * landing pad, or `paciasp` for edge_frame, when built with
 * -mbranch-protection=standard). Every asm function has .type and .size,
 * except edge_nosize. Everything but main is hidden, so that branches between
 * these functions stay direct in a shared library too.
 *
 * Must be probed and still run correctly; entry counts for one run:
 *   edge_adrp         3    first: adrp x1, edge_global (then a :lo12: load and store)
 *   edge_adr          4    first: adr x1, edge_table (a table just before the function)
 *   edge_ldr_lit      5    first: ldr x1, 1f (64-bit literal after the code)
 *   edge_ldr_w        2    first: ldr w1, 1f (32-bit literal 0xffffffff: zero-extended)
 *   edge_ldrsw        3    first: ldrsw x1, 1f (literal -1000: sign-extended)
 *   edge_ldr_d        4    first: ldr d1, 1f (literal 2.5)
 *   edge_ldr_q        5    first: ldr q0, 1f (literal {1, 2, 3, 4})
 *   edge_prfm         2    first: prfm pldl1keep, 1f
 *   edge_leaf         32   leaf, no stack frame: 14 direct + 6 from edge_frame + 12 from edge_tail
 *   edge_ret_only     13   one instruction: ret
 *   edge_frame        6    first: stp x29, x30, [sp, #-16]! (after paciasp); calls edge_leaf
 *   edge_cbz          7    first: cbz x0 (both ways taken)
 *   edge_tbnz         8    first: tbnz w0, #3 (both ways taken)
 *   edge_cmp_call     9    sets the flags with cmp, then calls edge_bne: flags live across a probe
 *   edge_bne          9    first: b.ne (both ways taken; the flags come from edge_cmp_call)
 *   edge_bl_wrap      10   first: stp x29, x30, [sp, #-32]!; enters edge_bl with b, returns via x19
 *   edge_bl           10   first: bl edge_callee (edge_bl returns with ret x19)
 *   edge_callee       10   C: checks that its return address is edge_bl_ret, right after that bl
 *   edge_blr_wrap     11   like edge_bl_wrap, for edge_blr
 *   edge_blr          11   first: blr x1 (x1 = edge_callee2)
 *   edge_callee2      11   C: checks that its return address is edge_blr_ret
 *   edge_tail         12   first: b edge_leaf (a tail call)
 *   edge_mid          15   cmp w0, #7 then, at edge_mid_body (a mid-function site, probed by
 *                          address), b.lt: flags live at the site; edge_mid_body runs 15 times
 *   edge_spin         10   first: subs w0, w0, #1, then b.ne edge_spin back to the entry:
 *                          2 calls (n = 4, 6) run the entry 10 times, and the probe counts each
 *   main              1
 *   edge_nosize       2    no .size and no CFI: extends to the next symbol
 *
 * Must be refused; they behave as before:
 *   edge_blraa        0    first: blraa x1, sp (an authenticated call); never called
 */
#include <stdint.h>
#include <stdio.h>

#define NOINLINE __attribute__((noinline, noipa))
#define HIDDEN __attribute__((visibility("hidden")))

#ifdef __ARM_FEATURE_BTI_DEFAULT
#define PAD "    hint #34\n" /* bti c */
#else
#define PAD ""
#endif
#ifdef __ARM_FEATURE_PAC_DEFAULT
#define PAC_SIGN "    hint #25\n" /* paciasp */
#define PAC_AUTH "    hint #29\n" /* autiasp */
#else
#define PAC_SIGN PAD
#define PAC_AUTH ""
#endif

#define FUNC(name) \
    "    .p2align 4\n" \
    "    .globl " #name "\n" \
    "    .hidden " #name "\n" \
    "    .type " #name ", %function\n" \
    #name ":\n"
#define END(name) "    .size " #name ", .-" #name "\n"

HIDDEN int edge_global __attribute__((used)) = 100;
HIDDEN int edge_ra_bad;
HIDDEN int edge_ra_seen;

extern char edge_bl_ret[] HIDDEN, edge_blr_ret[] HIDDEN;

HIDDEN int edge_adrp(void);
HIDDEN int edge_adr(int);
HIDDEN long edge_ldr_lit(long);
HIDDEN long edge_ldr_w(long);
HIDDEN long edge_ldrsw(long);
HIDDEN int edge_ldr_d(int);
HIDDEN int edge_ldr_q(int);
HIDDEN int edge_prfm(int);
HIDDEN int edge_leaf(int);
HIDDEN void edge_ret_only(void);
HIDDEN int edge_frame(int);
HIDDEN long edge_cbz(long);
HIDDEN int edge_tbnz(int);
HIDDEN int edge_cmp_call(int);
HIDDEN int edge_bl_wrap(int);
HIDDEN int edge_blr_wrap(int);
HIDDEN int edge_tail(int);
HIDDEN int edge_mid(int);
HIDDEN int edge_spin(int);
HIDDEN int edge_nosize(void);
HIDDEN int edge_blraa(void);

static int ra_matches(void *ra, const char *expected) {
    /* drop a pointer authentication code, if the return address carries one */
    return ((uintptr_t)ra & 0xFFFFFFFFFFFFull) == (uintptr_t)expected;
}

HIDDEN NOINLINE int edge_callee(int x) {
    edge_ra_seen++;
    if (!ra_matches(__builtin_return_address(0), edge_bl_ret))
        edge_ra_bad++;
    return 2 * x;
}

HIDDEN NOINLINE int edge_callee2(int x) {
    edge_ra_seen++;
    if (!ra_matches(__builtin_return_address(0), edge_blr_ret))
        edge_ra_bad++;
    return 3 * x;
}

__asm__(
    "    .text\n"

    FUNC(edge_adrp)
    PAD
    "    adrp x1, edge_global\n"
    "    ldr w0, [x1, #:lo12:edge_global]\n"
    "    add w0, w0, #1\n"
    "    str w0, [x1, #:lo12:edge_global]\n"
    "    ret\n"
    END(edge_adrp)

    "    .p2align 4\n"
    "edge_table:\n"
    "    .word 10, 20, 30, 40\n"
    FUNC(edge_adr)
    PAD
    "    adr x1, edge_table\n"
    "    and w0, w0, #3\n"
    "    ldr w0, [x1, w0, uxtw #2]\n"
    "    ret\n"
    END(edge_adr)

    FUNC(edge_ldr_lit)
    PAD
    "    ldr x1, 1f\n"
    "    add x0, x0, x1\n"
    "    ret\n"
    "    .p2align 3\n"
    "1:  .quad 0x0123456789abcdef\n"
    END(edge_ldr_lit)

    FUNC(edge_ldr_w)
    PAD
    "    ldr w1, 1f\n"
    "    add x0, x0, x1\n"
    "    ret\n"
    "    .p2align 2\n"
    "1:  .word 0xffffffff\n"
    END(edge_ldr_w)

    FUNC(edge_ldrsw)
    PAD
    "    ldrsw x1, 1f\n"
    "    add x0, x0, x1\n"
    "    ret\n"
    "    .p2align 2\n"
    "1:  .word -1000\n"
    END(edge_ldrsw)

    FUNC(edge_ldr_d)
    PAD
    "    ldr d1, 1f\n"
    "    scvtf d0, w0\n"
    "    fadd d0, d0, d1\n"
    "    fadd d0, d0, d1\n"
    "    fcvtzs w0, d0\n"
    "    ret\n"
    "    .p2align 3\n"
    "1:  .double 2.5\n"
    END(edge_ldr_d)

    FUNC(edge_ldr_q)
    PAD
    "    ldr q0, 1f\n"
    "    addv s0, v0.4s\n"
    "    fmov w1, s0\n"
    "    add w0, w0, w1\n"
    "    ret\n"
    "    .p2align 4\n"
    "1:  .word 1, 2, 3, 4\n"
    END(edge_ldr_q)

    FUNC(edge_prfm)
    PAD
    "    prfm pldl1keep, 1f\n"
    "    add w0, w0, #3\n"
    "    ret\n"
    "    .p2align 2\n"
    "1:  .word 0\n"
    END(edge_prfm)

    FUNC(edge_leaf)
    PAD
    "    lsl w0, w0, #1\n"
    "    ret\n"
    END(edge_leaf)

    FUNC(edge_ret_only)
    PAD
    "    ret\n"
    END(edge_ret_only)

    FUNC(edge_frame)
    PAC_SIGN
    "    stp x29, x30, [sp, #-16]!\n"
    "    mov x29, sp\n"
    "    add w0, w0, #1\n"
    "    bl edge_leaf\n"
    "    ldp x29, x30, [sp], #16\n"
    PAC_AUTH
    "    ret\n"
    END(edge_frame)

    FUNC(edge_cbz)
    PAD
    "    cbz x0, 1f\n"
    "    add x0, x0, #5\n"
    "    ret\n"
    "1:  mov x0, #-1\n"
    "    ret\n"
    END(edge_cbz)

    FUNC(edge_tbnz)
    PAD
    "    tbnz w0, #3, 1f\n"
    "    add w0, w0, #100\n"
    "    ret\n"
    "1:  neg w0, w0\n"
    "    ret\n"
    END(edge_tbnz)

    FUNC(edge_bne)
    PAD
    "    b.ne 1f\n"
    "    mov w0, #77\n"
    "    ret\n"
    "1:  add w0, w0, #1000\n"
    "    ret\n"
    END(edge_bne)

    FUNC(edge_cmp_call)
    PAC_SIGN
    "    stp x29, x30, [sp, #-16]!\n"
    "    mov x29, sp\n"
    "    cmp w0, #4\n"
    "    bl edge_bne\n"
    "    ldp x29, x30, [sp], #16\n"
    PAC_AUTH
    "    ret\n"
    END(edge_cmp_call)

    FUNC(edge_bl_wrap)
    PAC_SIGN
    "    stp x29, x30, [sp, #-32]!\n"
    "    mov x29, sp\n"
    "    str x19, [sp, #16]\n"
    "    adr x19, 1f\n"
    "    b edge_bl\n"
    "1:  ldr x19, [sp, #16]\n"
    "    ldp x29, x30, [sp], #32\n"
    PAC_AUTH
    "    ret\n"
    END(edge_bl_wrap)

    FUNC(edge_bl)
    PAD
    "    bl edge_callee\n"
    "    .globl edge_bl_ret\n"
    "    .hidden edge_bl_ret\n"
    "edge_bl_ret:\n"
    "    add w0, w0, #1\n"
    "    ret x19\n"
    END(edge_bl)

    FUNC(edge_blr_wrap)
    PAC_SIGN
    "    stp x29, x30, [sp, #-32]!\n"
    "    mov x29, sp\n"
    "    str x19, [sp, #16]\n"
    "    adrp x1, edge_callee2\n"
    "    add x1, x1, #:lo12:edge_callee2\n"
    "    adr x19, 1f\n"
    "    b edge_blr\n"
    "1:  ldr x19, [sp, #16]\n"
    "    ldp x29, x30, [sp], #32\n"
    PAC_AUTH
    "    ret\n"
    END(edge_blr_wrap)

    FUNC(edge_blr)
    PAD
    "    blr x1\n"
    "    .globl edge_blr_ret\n"
    "    .hidden edge_blr_ret\n"
    "edge_blr_ret:\n"
    "    add w0, w0, #2\n"
    "    ret x19\n"
    END(edge_blr)

    FUNC(edge_tail)
    PAD
    "    b edge_leaf\n"
    END(edge_tail)

    FUNC(edge_mid)
    PAD
    "    cmp w0, #7\n"
    "    .globl edge_mid_body\n"
    "    .hidden edge_mid_body\n"
    "edge_mid_body:\n"
    "    b.lt 1f\n"
    "    mov w0, #7\n"
    "1:  add w0, w0, #1\n"
    "    ret\n"
    END(edge_mid)

    FUNC(edge_spin)
    PAD
    "    subs w0, w0, #1\n"
    "    b.ne edge_spin\n"
    "    ret\n"
    END(edge_spin)

    FUNC(edge_blraa)
    PAD
    "    .inst 0xd73f083f\n" /* blraa x1, sp */
    "    ret\n"
    END(edge_blraa)

    /* deliberately no .size */
    FUNC(edge_nosize)
    PAD
    "    mov w0, #7\n"
    "    ret\n"
    "    .p2align 4\n");

int main(void) {
    int v = 0;
    for (int i = 0; i < 3; i++)
        v = edge_adrp();
    printf("adrp=%d global=%d\n", v, edge_global);

    int s = 0;
    for (int i = 0; i < 4; i++)
        s += edge_adr(i + 1);
    printf("adr=%d\n", s);

    for (long i = 0; i < 5; i++)
        printf("ldr_lit(%ld)=%#lx\n", i, edge_ldr_lit(i));
    for (long i = 0; i < 2; i++)
        printf("ldr_w(%ld)=%#lx\n", i, edge_ldr_w(i));
    for (long i = 0; i < 3; i++)
        printf("ldrsw(%ld)=%ld\n", i, edge_ldrsw(i));
    for (int i = 0; i < 4; i++)
        printf("ldr_d(%d)=%d\n", i, edge_ldr_d(i));
    for (int i = 0; i < 5; i++)
        printf("ldr_q(%d)=%d\n", i, edge_ldr_q(i));
    for (int i = 0; i < 2; i++)
        printf("prfm(%d)=%d\n", i, edge_prfm(i));

    int l = 0;
    for (int i = 0; i < 14; i++)
        l += edge_leaf(i);
    printf("leaf=%d\n", l);
    for (int i = 0; i < 13; i++)
        edge_ret_only();
    int f = 0;
    for (int i = 0; i < 6; i++)
        f += edge_frame(i);
    printf("frame=%d\n", f);

    for (long i = -3; i <= 3; i++)
        printf("cbz(%ld)=%ld\n", i, edge_cbz(i));
    for (int i = 4; i < 12; i++)
        printf("tbnz(%d)=%d\n", i, edge_tbnz(i));
    for (int i = 0; i < 9; i++)
        printf("bne(%d)=%d\n", i, edge_cmp_call(i));

    for (int i = 0; i < 10; i++)
        printf("bl(%d)=%d\n", i, edge_bl_wrap(i));
    for (int i = 0; i < 11; i++)
        printf("blr(%d)=%d\n", i, edge_blr_wrap(i));
    printf("ra_seen=%d ra_bad=%d\n", edge_ra_seen, edge_ra_bad);

    int t = 0;
    for (int i = 0; i < 12; i++)
        t += edge_tail(i);
    printf("tail=%d\n", t);

    int m = 0;
    for (int i = 0; i < 15; i++)
        m += edge_mid(i);
    printf("mid=%d\n", m);
    printf("spin=%d,%d\n", edge_spin(4), edge_spin(6));
    for (int i = 0; i < 2; i++)
        printf("nosize=%d\n", edge_nosize());
    return 0;
}
