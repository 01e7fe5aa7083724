// urewrite AArch64 runtime: assembled by Keystone into every rewritten file.
//
// It runs once per process (start-up hook, or lazily after fork) and on the rare
// slow hit path. It uses only raw system calls: no libc, no loader support.
// Fields in braces are filled in by runtime.py before assembly.
//
// Registers: x19 = state page (cleared in a forked child by MADV_WIPEONFORK):
//   [x19] region address, or 1 = disarmed, 0 = not set up;
//   [x19 + 8] set-up in progress: thread pointer of the thread doing it.
// x20 = x19 + 4096, the state that survives fork: PS_STARTED, PS_TOO_LONG,
// PS_TCB (a stand-in thread control block before libc sets one), PS_DIR (the
// variable's value); x20 + 4096: the region file name; x20 + 8192: a buffer
// for /proc/self/environ.

link_table:
lt_self:     .quad 0          // link-time address of link_table
lt_state:    .quad 0          // state memory - link_table
lt_template: .quad 0          // region template - link_table
lt_tsize:    .quad 0          // template size
lt_rsize:    .quad 0          // region size
hash_k:      .quad {HASH_MULTIPLIER}
file_tag:    .byte {TAG_BYTES}
var_name:    .ascii "{ENV_VAR}="
proc_environ: .ascii "/proc/self/environ"
             .byte 0
             .p2align 2

// x19 <- state page, x20 <- the part that survives fork
load_state:
    adr x9, link_table
    ldr x10, [x9, #8]
    add x19, x9, x10
    add x20, x19, #1, lsl #12
    ret

// Start-up hook for executables (the new e_entry): [sp] = argc, then argv, envp.
exe_start:
    hint #34                               // bti c
{SAVE_ALL}
    bl load_state
    ldr x9, [sp, #{FRAME}]
    add x0, sp, #{FRAME_PLUS_8}
    add x0, x0, x9, lsl #3
    add x0, x0, #8                         // envp = &argv[argc + 1]
    bl capture_env_vector
    bl ensure_thread_pointer
    bl setup_region
{RESTORE_ALL}
exe_tail:
    brk #0                                 // becomes: b <original entry point>

// Start-up hook for shared objects (the new DT_INIT): continues at the original one.
dso_start:
    hint #34                               // bti c
    str x30, [sp, #-16]!
    bl lazy_init
    ldr x30, [sp], #16
dso_tail:
    brk #0                                 // becomes: b <original DT_INIT>

// Set-up from a trampoline (or dso_start): every register and the flags are preserved.
lazy_init:
{SAVE_ALL}
    bl load_state
    ldr x9, [x20, #{PS_STARTED}]
    cbnz x9, li_have_env
    bl capture_env_proc
li_have_env:
    bl setup_region
{RESTORE_ALL}
    ret

// x0 = envp array. Copies the variable's value into PS_DIR.
capture_env_vector:
    str x30, [sp, #-16]!
    mov x9, #1
    str x9, [x20, #{PS_STARTED}]
    mov x12, x0
cev_next:
    ldr x1, [x12], #8
    cbz x1, cev_done
    bl match_var
    cbz x1, cev_next
    bl copy_dir
cev_done:
    ldr x30, [sp], #16
    ret

// Reads /proc/self/environ into the buffer and looks for the variable there.
capture_env_proc:
    str x30, [sp, #-16]!
    mov x9, #1
    str x9, [x20, #{PS_STARTED}]
    mov x0, #-100                          // AT_FDCWD
    adr x1, proc_environ
    movz x2, #8, lsl #16                   // O_RDONLY | O_CLOEXEC
    mov x3, #0
    mov x8, #56                            // openat
    svc #0
    tbnz x0, #63, cep_done
    mov x21, x0                            // fd
    add x22, x20, #2, lsl #12              // write position
    add x23, x22, #{ENVBUF_PAGES}, lsl #12
    sub x23, x23, #1                       // end, keeping a byte for the terminator
cep_read:
    mov x0, x21
    mov x1, x22
    sub x2, x23, x22
    cbz x2, cep_close
    mov x8, #63                            // read
    svc #0
    cmp x0, #0
    b.le cep_close
    add x22, x22, x0
    b cep_read
cep_close:
    strb wzr, [x22]
    mov x0, x21
    mov x8, #57                            // close
    svc #0
    add x24, x20, #2, lsl #12              // current string; x22 = end
cep_scan:
    cmp x24, x22
    b.hs cep_done
    mov x1, x24
    bl match_var
    cbz x1, cep_skip
    bl copy_dir
    b cep_done
cep_skip:
    ldrb w9, [x24], #1
    cbnz w9, cep_skip
    b cep_scan
cep_done:
    ldr x30, [sp], #16
    ret

// x1 = "NAME=value" candidate -> x1 = value, or 0 when it is another variable
match_var:
    adr x9, var_name
    mov x10, #{ENV_VAR_LEN}
mv_loop:
    ldrb w11, [x1]
    ldrb w13, [x9]
    cmp w11, w13
    b.ne mv_no
    add x1, x1, #1
    add x9, x9, #1
    subs x10, x10, #1
    b.ne mv_loop
    ret
mv_no:
    mov x1, #0
    ret

// x1 = value -> PS_DIR; a value longer than {DIR_MAX} bytes disarms (never a cut path)
copy_dir:
    add x9, x20, #{PS_DIR}
    mov x10, #{DIR_MAX}
cd_loop:
    ldrb w11, [x1], #1
    cbz w11, cd_end
    strb w11, [x9], #1
    subs x10, x10, #1
    b.ne cd_loop
    mov w11, #1
    strb w11, [x20, #{PS_TOO_LONG}]
cd_end:
    strb wzr, [x9]
    ret

// A statically linked program starts with no thread pointer until libc sets
// one; trampolines hash tpidr_el0, so give it a stand-in until then.
ensure_thread_pointer:
    mrs x9, tpidr_el0
    cbnz x9, etp_done
    add x9, x20, #{PS_TCB}
    msr tpidr_el0, x9
etp_done:
    ret

// Creates and maps this process's region, or marks the probes disarmed.
setup_region:
    str x30, [sp, #-16]!
    ldr x9, [x19]
    cbnz x9, sr_ret
    // No thread pointer yet (a hit while the loader relocates, before TLS
    // exists): stay unarmed and try again on a later hit.
    mrs x12, tpidr_el0
    cbz x12, sr_ret
    // One thread sets up; the others wait for it. The same thread again means a
    // signal handler interrupted its own set-up: that hit goes uncounted.
    add x13, x19, #8
sr_claim:
    ldaxr x9, [x13]
    cbnz x9, sr_busy
    stlxr w10, x12, [x13]
    cbnz w10, sr_claim
    ldr x9, [x19]
    cbz x9, sr_setup
    str xzr, [x19, #8]                     // set up by another thread meanwhile
    b sr_ret
sr_busy:
    clrex
    cmp x9, x12
    b.eq sr_ret
    yield
    ldr x9, [x19]
    cbnz x9, sr_ret
    b sr_claim
sr_setup:
    mov x0, x19
    mov x1, #4096
    mov x2, #18                            // MADV_WIPEONFORK
    mov x8, #233                           // madvise
    svc #0
    ldrb w9, [x20, #{PS_DIR}]
    cbz w9, sr_disarm
    ldrb w9, [x20, #{PS_TOO_LONG}]
    cbnz w9, sr_disarm
    // A set-user-ID or set-group-ID program must not create files where its caller says.
    mov x8, #174                           // getuid
    svc #0
    mov x9, x0
    mov x8, #175                           // geteuid
    svc #0
    cmp x0, x9
    b.ne sr_disarm
    mov x8, #176                           // getgid
    svc #0
    mov x9, x0
    mov x8, #177                           // getegid
    svc #0
    cmp x0, x9
    b.ne sr_disarm
    // name = DIR "/" TAG "." PID [ "-" N ] ".ure"
    add x0, x20, #1, lsl #12
    add x1, x20, #{PS_DIR}
    bl append_str
    mov w9, #0x2f
    strb w9, [x0], #1
    adr x1, file_tag
    bl append_str
    mov w9, #0x2e
    strb w9, [x0], #1
    mov x14, x0
    mov x8, #172                           // getpid
    svc #0
    mov x15, x0                            // x15 = pid
    mov x0, x14
    mov x1, x15
    bl append_decimal
    mov x21, x0                            // where the suffix goes
    mov x22, #0                            // attempt: the same pid after exec gets "-1", "-2", ...
sr_try:
    mov x0, x21
    cbz x22, sr_suffix
    mov w9, #0x2d
    strb w9, [x0], #1
    add w9, w22, #0x30
    strb w9, [x0], #1
sr_suffix:
    movz w9, #0x752e
    movk w9, #0x6572, lsl #16              // ".ure"
    str w9, [x0]
    strb wzr, [x0, #4]
    mov x0, #-100                          // AT_FDCWD
    add x1, x20, #1, lsl #12
    movz x2, #0xc2
    movk x2, #8, lsl #16                   // O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC
    mov x3, #0x1a4                         // 0644
    mov x8, #56                            // openat
    svc #0
    cmn x0, #17                            // EEXIST
    b.ne sr_opened
    add x22, x22, #1
    cmp x22, #10
    b.lo sr_try
    b sr_disarm
sr_opened:
    tbnz x0, #63, sr_disarm
    mov x23, x0                            // fd
    ldr x1, lt_rsize
    mov x8, #46                            // ftruncate
    svc #0
    tbnz x0, #63, sr_close_disarm
    mov x0, #0
    ldr x1, lt_rsize
    mov x2, #3                             // PROT_READ | PROT_WRITE
    mov x3, #1                             // MAP_SHARED
    mov x4, x23
    mov x5, #0
    mov x8, #222                           // mmap
    svc #0
    mov x24, x0                            // region
    mov x0, x23
    mov x8, #57                            // close
    svc #0
    tbnz x24, #63, sr_disarm
    // copy the template: header, probe table, names
    adr x9, link_table
    ldr x10, [x9, #16]
    add x10, x9, x10
    ldr x11, [x9, #24]
    mov x12, x24
sr_copy:
    cbz x11, sr_copied
    ldrb w13, [x10], #1
    strb w13, [x12], #1
    sub x11, x11, #1
    b sr_copy
sr_copied:
    str w15, [x24, #{OFF_PID}]
    adr x9, link_table
    ldr x10, [x9]
    sub x10, x9, x10
    str x10, [x24, #{OFF_LOAD_BIAS}]
    // enable the probed USDT semaphores: the table after the template (8-aligned)
    ldr x11, [x9, #16]
    add x11, x9, x11
    ldr x12, [x9, #24]
    add x11, x11, x12
    add x11, x11, #7
    and x11, x11, #0xfffffffffffffff8
    ldr x12, [x11], #8
sr_semaphore:
    cbz x12, sr_semaphores_done
    ldr x13, [x11], #8
    add x13, x13, x10
sr_semaphore_add:
    ldxrh w14, [x13]
    add w14, w14, #1
    stxrh w9, w14, [x13]
    cbnz w9, sr_semaphore_add
    sub x12, x12, #1
    b sr_semaphore
sr_semaphores_done:
    // owner table: each per-thread slot points at its counter row
    ldr x9, [x24, #{OFF_OWNERS}]
    add x9, x24, x9
    ldr x10, [x24, #{OFF_COUNTERS}]
    add x10, x24, x10
    ldr w11, [x24, #{OFF_SLOT_COUNT}]
    ldr x12, [x24, #{OFF_SLOT_STRIDE}]
sr_owner:
    str x10, [x9, #8]
    add x9, x9, #{OWNER_ENTRY_SIZE}
    add x10, x10, x12
    subs w11, w11, #1
    b.ne sr_owner
    stlr x24, [x19]                        // publish: a release store orders the set-up before it
    str xzr, [x19, #8]
sr_ret:
    ldr x30, [sp], #16
    ret
sr_close_disarm:
    mov x0, x23
    mov x8, #57
    svc #0
sr_disarm:
    mov x9, #1
    str x9, [x19]
    str xzr, [x19, #8]
    b sr_ret

// x1 = NUL-terminated string, appended at x0 (x0 ends on the terminator position)
append_str:
    ldrb w9, [x1], #1
    cbz w9, as_end
    strb w9, [x0], #1
    b append_str
as_end:
    ret

// x1 = value, appended at x0 in decimal
append_decimal:
    sub sp, sp, #32
    add x9, sp, #32
    mov x10, #10
ad_div:
    udiv x11, x1, x10
    msub x12, x11, x10, x1
    add w12, w12, #0x30
    strb w12, [x9, #-1]!
    mov x1, x11
    cbnz x1, ad_div
    add x10, sp, #32
ad_out:
    ldrb w12, [x9], #1
    strb w12, [x0], #1
    cmp x9, x10
    b.ne ad_out
    add sp, sp, #32
    ret

// A hit whose thread has no slot yet (or shares one): x16 = region, x17 =
// thread pointer, x0 = probe offset in a counter row. Clobbers x0, x1, x16,
// x17 only; the flags are preserved.
slow_hit:
    sub sp, sp, #32
    stp x2, x3, [sp]
    mrs x2, nzcv
    str x2, [sp, #16]
    cbz x17, sh_shared
    ldr x1, hash_k
    mul x1, x17, x1
    lsr x1, x1, #{SLOT_SHIFT}
    and x1, x1, #{SLOT_MASK}
    add x1, x1, x16
    ldr x2, [x16, #{OFF_OWNERS}]
    add x1, x1, x2                         // x1 = this thread's owner entry
sh_claim:
    ldaxr x2, [x1]
    cbnz x2, sh_taken
    stlxr w3, x17, [x1]                    // claim the slot for this thread
    cbnz w3, sh_claim
    ldr x1, [x1, #8]
    b sh_add
sh_taken:
    clrex
sh_shared:
    ldr w1, [x16, #{OFF_SLOT_COUNT}]
    ldr x2, [x16, #{OFF_SLOT_STRIDE}]
    mul x1, x1, x2
    ldr x2, [x16, #{OFF_COUNTERS}]
    add x1, x1, x2
    add x1, x1, x16
sh_add:
    add x1, x1, x0
sh_retry:
    ldxr x2, [x1]
    add x2, x2, #1
    stxr w3, x2, [x1]
    cbnz w3, sh_retry
    ldr x2, [sp, #16]
    msr nzcv, x2
    ldp x2, x3, [sp]
    add sp, sp, #32
    ret

// Events and latencies are not recorded on AArch64 yet: the trampolines never call these.
trace_event:
    ret
lat_enter:
    ret
lat_exit:
    ret
