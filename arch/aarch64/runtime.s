// urewrite AArch64 runtime: assembled by Keystone into every rewritten file.
//
// It runs once per process (start-up hook, or lazily after fork) and on the rare
// slow hit path. It uses only raw system calls: no libc, no loader support.
// Fields in braces are filled in by runtime.py before assembly.
//
// Registers: x19 = state page (cleared in a forked child by MADV_WIPEONFORK):
//   [x19] region address, or 1 = disarmed, 0 = not set up;
//   [x19 + 8] set-up in progress: thread pointer of the thread doing it.
//   [x19 + {ASIDE_BUSY}] lazy_init_aside's stack in use, [x19 + {ASIDE_SP}] the sp it came
//   from; that stack: [x19 + {ASIDE_BOTTOM}, x19 + {ASIDE_TOP}).
// x20 = x19 + 4096, the state that survives fork: PS_STARTED, PS_TOO_LONG,
// PS_TRACE (ring entries asked for by the trace variable), PS_PROGRAM and
// PS_PROGRAM_MAPS (a probe program's mapped files, or 0), PS_COMM (the process's
// name when they were mapped), PS_LATENCY (latency asked for), PS_TCB (a stand-in
// thread control block before libc sets one), PS_DIR (the variable's value);
// x20 + 4096: the region file name; x20 + 8192: a buffer for /proc/self/environ.

link_table:
lt_self:     .quad 0          // link-time address of link_table
lt_state:    .quad 0          // state memory - link_table
lt_template: .quad 0          // region template - link_table
lt_tsize:    .quad 0          // template size
lt_rsize:    .quad 0          // region size
lt_program:  .quad 0          // a program built into the probes - link_table, or 0
hash_k:      .quad {HASH_MULTIPLIER}
program_magic: .quad {PROGRAM_MAGIC}
maps_magic:  .quad {MAPS_MAGIC}
object_lowest: .quad {OBJECT_LOWEST} // this object's lowest link-time address
file_tag:    .byte {TAG_BYTES}
var_name:    .ascii "{ENV_VAR}="
trace_var_name: .ascii "{TRACE_VAR}="
latency_var_name: .ascii "{LATENCY_VAR}="
proc_environ: .ascii "/proc/self/environ"
             .byte 0
program_suffix: .ascii "{PROGRAM_SUFFIX}"
             .byte 0
own_maps_prefix: .ascii "/{OWN_MAPS_PREFIX}"
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
    bl consider_var
    b cev_next
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
    bl consider_var
cep_skip:
    ldrb w9, [x24], #1
    cbnz w9, cep_skip
    b cep_scan
cep_done:
    ldr x30, [sp], #16
    ret

// x1 = "NAME=value": records the value if NAME is one of ours.
// Clobbers x1, x9-x11, x13-x15.
consider_var:
    str x30, [sp, #-16]!
    mov x14, x1
    adr x9, var_name
    mov x10, #{ENV_VAR_LEN}
    bl match_prefix
    cbz x1, cv_trace
    bl copy_dir
    b cv_done
cv_trace:
    mov x1, x14
    adr x9, trace_var_name
    mov x10, #{TRACE_VAR_LEN}
    bl match_prefix
    cbz x1, cv_latency
    mov x9, #0                             // the ring size, in decimal, at most {RING_MAX}
    mov x13, #10
    mov x15, #{RING_MAX}
cv_digit:
    ldrb w11, [x1], #1
    sub w11, w11, #0x30
    cmp w11, #9
    b.hi cv_number
    madd x9, x9, x13, x11
    cmp x9, x15
    b.ls cv_digit
    mov x9, x15
cv_number:
    str x9, [x20, #{PS_TRACE}]
    b cv_done
cv_latency:
    mov x1, x14
    adr x9, latency_var_name
    mov x10, #{LATENCY_VAR_LEN}
    bl match_prefix
    cbz x1, cv_done
    ldrb w11, [x1]                         // timed unless the value is empty or "0..."
    cmp w11, #0x30
    ccmp w11, #0, #4, ne                   // (equal to "0": Z set, as if empty)
    cset w11, ne
    strb w11, [x20, #{PS_LATENCY}]
cv_done:
    ldr x30, [sp], #16
    ret

// x1 = candidate, x9 = prefix, x10 = its length -> x1 = what follows it, or 0
match_prefix:
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
    dmb ish                                // the claim is seen before the state is read:
    ldr x9, [x19]                          // a live tracer that disarms (stores 1, then
    cbz x9, sr_setup                       // reads the claim) never misses a set-up
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
    mov x8, #172                           // getpid
    bl append_dot_call                     // x15 = pid
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
    mov x3, #0x180                         // 0600: traced arguments are the program's data
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
    // under `urewrite trace`, an event ring follows the counters: its entries,
    // a power of two in [{RING_MIN}, {RING_MAX}], go to x25. A probe program's hits
    // take the trace path, which a ring opens: with one mapped, there is a ring
    // (the least, if none was asked for)
    bl program_setup
    mov x25, #0
    ldr x9, [x20, #{PS_TRACE}]
    cbnz x9, sr_ring
    cbz x0, sr_size
    mov x9, #1
sr_ring:
    mov x25, #{RING_MIN}
sr_ring_round:
    cmp x25, x9
    b.hs sr_size
    lsl x25, x25, #1
    b sr_ring_round
sr_size:
    ldr x22, lt_rsize                      // x22 = region size
    cbz x25, sr_truncate
    add x22, x22, x25, lsl #{RECORD_SHIFT}
    add x22, x22, #{RING_RECORDS}
sr_truncate:
    mov x0, x23
    mov x1, x22
    mov x8, #46                            // ftruncate
    svc #0
    tbnz x0, #63, sr_close_disarm
    // the template (header, probe table, names) written into the file, not copied
    // through the mapping: its pages are never faulted into this process
    mov x0, x23
    adr x9, link_table
    ldr x1, [x9, #16]
    add x1, x9, x1
    ldr x2, [x9, #24]
    mov x3, #0
    mov x8, #68                            // pwrite64
    svc #0
    cmp x0, x2
    b.ne sr_close_disarm                   // (a short write: no room left)
    mov x0, #0
    mov x1, x22
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
    str w15, [x24, #{OFF_PID}]
    adr x9, link_table
    ldr x10, [x9]
    sub x10, x9, x10
    str x10, [x24, #{OFF_LOAD_BIAS}]
    ldrb w13, [x20, #{PS_LATENCY}]         // latency asked for: lat_enter and lat_exit time calls
    cbz w13, sr_untimed                    // (x10, the load bias, is the semaphores')
    ldr w13, [x24, #{OFF_FLAGS}]
    orr w13, w13, #{FLAG_LATENCY}
    str w13, [x24, #{OFF_FLAGS}]
sr_untimed:
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
    str x22, [x24, #{OFF_REGION_SIZE}]
    cbz x25, sr_untraced
    ldr x9, lt_rsize
    str w25, [x24, #{OFF_RING_ENTRIES}]
    dmb ishst                              // the header before the ring: readers see the
    str x9, [x24, #{OFF_RING}]             // ring, then read the rest (trampolines/ring.py)
    // fault the ring's pages in now, not one per 32 events on the hit path
    // (MADV_POPULATE_WRITE, Linux 5.14; where it is refused, as qemu does, touch each page)
    add x0, x24, x9
    sub x1, x22, x9
    mov x2, #23
    mov x8, #233                           // madvise
    svc #0
    cbz x0, sr_ring_ready
    add x0, x24, x9
    sub x1, x22, x9
sr_touch_ring:
    ldrb w2, [x0]                          // a write that keeps the byte
    strb w2, [x0]
    add x0, x0, #4096
    subs x1, x1, #4096
    b.gt sr_touch_ring
sr_ring_ready:
    b sr_calibrate
sr_untraced:
    ldr w9, [x24, #{OFF_FLAGS}]
    tbz w9, #0, sr_publish                 // (bit 0: FLAG_LATENCY)
    ldr w9, [x24, #{OFF_LATENCY_COUNT}]
    cbz w9, sr_publish
sr_calibrate:                              // events and latencies need the clock
    bl calibrate_clock
sr_publish:
    stlr x24, [x19]                        // publish: a release store orders the set-up before it
    add x9, x19, #8
    stlr xzr, [x9]                         // and the region before the claim's release
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

// x8 = a system call of no argument (getpid, getuid): "." and its result in decimal,
// appended at x0 (as append_decimal); x15 = the result. Clobbers x1, x9-x12, x14.
append_dot_call:
    mov x14, x30
    mov w9, #0x2e
    strb w9, [x0], #1
    mov x15, x0
    svc #0
    mov x1, x0
    mov x0, x15
    mov x15, x1
    bl append_decimal
    mov x30, x14
    ret

// A hit whose hashed owner entry is not this thread's: x16 = region, x17 = thread
// pointer. Looks at {OWNER_PROBES} entries from the hashed one (wrapping) for this
// thread's own, or a free one to claim; all owned by others, or no thread pointer:
// the shared row. -> x0 = the row to count in; x1 = 0 when it is this thread's own
// (measure latency there), else 1 (the shared row: exclusive adds only). Clobbers
// x0, x1 only; the flags are preserved.
slow_hit:
    sub sp, sp, #48
    stp x2, x3, [sp]
    stp x4, x5, [sp, #16]
    mrs x2, nzcv
    str x2, [sp, #32]
    cbz x17, sh_shared
{SLOW_HIT_SHARED_TP}
    ldr x1, hash_k
    mul x1, x17, x1
    lsr x1, x1, #{SLOT_SHIFT}
    and x1, x1, #{SLOT_MASK}               // x1 = the hashed entry's offset in the table
    ldr x4, [x16, #{OFF_OWNERS}]
    add x4, x16, x4                        // x4 = the owner table
    mov x5, #{OWNER_PROBES}                // entries left to look at
sh_entry:
    add x0, x4, x1                         // x0 = the entry
sh_claim:
    ldaxr x2, [x0]
    cbz x2, sh_free
    clrex
    cmp x2, x17
    b.eq sh_owned                          // this thread's, from an earlier hit
    add x1, x1, #{OWNER_ENTRY_SIZE}        // another thread's: the next one
    and x1, x1, #{SLOT_MASK}
    subs x5, x5, #1
    b.ne sh_entry
    b sh_shared
sh_free:
    stlxr w3, x17, [x0]                    // claim the slot for this thread (its id is
    cbnz w3, sh_claim                      // learnt on first need: thread_tid)
sh_owned:
    ldr x0, [x0, #8]                       // its counter row
    mov x1, #0
    b sh_return
sh_shared:
    ldr w1, [x16, #{OFF_SLOT_COUNT}]
    ldr x2, [x16, #{OFF_SLOT_STRIDE}]
    mul x1, x1, x2
    ldr x2, [x16, #{OFF_COUNTERS}]
    add x1, x1, x2
    add x0, x1, x16                        // the row after the per-thread ones
    mov x1, #1
sh_return:
    ldr x2, [sp, #32]
    msr nzcv, x2
    ldp x4, x5, [sp, #16]
    ldp x2, x3, [sp]
    add sp, sp, #48
    ret

// Reads the counter's frequency and pairs its ticks with CLOCK_MONOTONIC, for
// readers to turn ticks into nanoseconds: of a few pairs, the one taken in the
// narrowest window of ticks (a first call can run cold: qemu translates it).
// x24 = region. Clobbers x0-x2, x8-x13, x21.
calibrate_clock:
    sub sp, sp, #16
    movz x11, #0xca00
    movk x11, #0x3b9a, lsl #16             // 1000000000
    mov x12, #-1                           // the narrowest window so far
    mov x13, #4                            // pairs to take
cc_pair:
    isb
    mrs x21, cntvct_el0
    mov x0, #1                             // CLOCK_MONOTONIC
    mov x1, sp
    mov x8, #113                           // clock_gettime
    svc #0
    isb
    mrs x9, cntvct_el0
    sub x9, x9, x21
    cmp x9, x12
    b.hs cc_next
    mov x12, x9
    add x21, x21, x9, lsr #1               // ticks halfway through the call
    ldp x9, x10, [sp]
    madd x9, x9, x11, x10
    str x21, [x24, #{OFF_CLOCK_REF_TICKS}]
    str x9, [x24, #{OFF_CLOCK_REF_NS}]
cc_next:
    subs x13, x13, #1
    b.ne cc_pair
    mrs x9, cntfrq_el0
    str x9, [x24, #{OFF_CLOCK_HZ}]
    mov w10, #{CLOCK_KIND}
    str w10, [x24, #{OFF_CLOCK_KIND}]
    lsl x11, x11, #32
    udiv x10, x11, x9                      // ns per tick, 32.32 fixed point (0 if no frequency)
    str x10, [x24, #{OFF_NS_MULT}]
    add sp, sp, #16
    ret

// The events of one probe point, into the ring. x16 = the point's event table:
// u64 count, then per event u64 probe index and its argument descriptors
// (u64 n, n x 16 bytes). sp = the trampoline's frame: the site's x16, x17 at
// [sp + {TF_X16}], x0, x1 at [sp + {TF_X0}], x30 at [sp + {TF_LR}]; the site's
// sp is sp + {TRAMPOLINE_FRAME}. Preserves every register but x0, x1, x16, x17
// (the trampoline restores those) and the flags.
// The trace path of Go code (compiled Go: x28 = g): trace_event needs more stack
// than a goroutine's holds below sp at the deepest nosplit chains, so the event is
// written only where the goroutine's stack has {TRACE_ROOM} bytes below sp (sp
// between g.stack.lo + that and g.stack.hi); else it is dropped, counted in the
// ring. x16 = the events, x0 = the ring; x0, x1 and x17 are free (the trampoline's
// frame holds them); the flags are kept.
trace_event_go:
    mrs x1, nzcv
    cbz x28, tg_drop
    ldr x17, [x28]                         // g.stack.lo
    add x17, x17, #{TRACE_ROOM}
    cmp sp, x17
    b.lo tg_drop
    ldr x17, [x28, #8]                     // g.stack.hi
    cmp sp, x17
    b.hi tg_drop
    msr nzcv, x1
    b trace_event
tg_drop:
    add x0, x0, #{RING_DROPPED}
tg_count:
    ldxr x17, [x0]
    add x17, x17, #1
    stxr w16, x17, [x0]
    cbnz w16, tg_count
    msr nzcv, x1
    ret

trace_event:
    sub sp, sp, #272                       // slots 0-30: x0-x30, 31: sp; nzcv, return
    stp x2, x3, [sp, #16]
    stp x4, x5, [sp, #32]
    stp x6, x7, [sp, #48]
    stp x8, x9, [sp, #64]
    stp x10, x11, [sp, #80]
    stp x12, x13, [sp, #96]
    stp x14, x15, [sp, #112]
    stp x18, x19, [sp, #144]
    stp x20, x21, [sp, #160]
    stp x22, x23, [sp, #176]
    stp x24, x25, [sp, #192]
    stp x26, x27, [sp, #208]
    stp x28, x29, [sp, #224]
    mrs x9, nzcv
    stp x9, x30, [sp, #256]
    add x9, sp, #272                       // the trampoline's frame
    ldp x10, x11, [x9, #{TF_X16}]
    stp x10, x11, [sp, #128]
    ldp x10, x11, [x9, #{TF_X0}]
    stp x10, x11, [sp]
    ldr x10, [x9, #{TF_LR}]
    add x11, x9, #{TRAMPOLINE_FRAME}
    stp x10, x11, [sp, #240]
    mov x21, sp                            // x21 = the frame
    ldr x22, [x16], #8                     // x22 = events left
    mov x23, x16                           // x23 = the next event's description
    bl load_state
    ldr x24, [x19]                         // x24 = region: read again, so a live tracer
    cmp x24, #1                            // may have disarmed (1) or re-armed (0, or a
    b.ls te_return                         // region without a ring) since the hit counted
    ldr x9, [x20, #{PS_PROGRAM}]           // a probe program's hits: no event of their own
    cbnz x9, te_programs                   // (its ring holds its printf()s)
    ldr x26, [x24, #{OFF_RING}]
    cbz x26, te_return
    add x26, x24, x26                      // x26 = ring
    ldr w9, [x24, #{OFF_RING_ENTRIES}]
    sub x9, x9, #1                         // x9 = position mask
te_event:
    cbz x22, te_return
    sub x22, x22, #1
    ldr x25, [x23], #8                     // probe index; x23 = its descriptors
te_head:
    ldxr x10, [x26]                        // take a position: head += 1 ({RING_HEAD} = 0)
    add x11, x10, #1
    stxr w12, x11, [x26]
    cbnz w12, te_head
    and x11, x10, x9
    add x27, x26, x11, lsl #{RECORD_SHIFT}
    add x27, x27, #{RING_RECORDS}          // x27 = the record
    lsl x28, x10, #1
    add x28, x28, #1                       // x28 = its sequence while written; + 1 when done
te_claim:
    ldxr x10, [x27]                        // the sequence ({REC_SEQ} = 0)
    tbnz x10, #0, te_busy                  // another writer is in it (the ring lapped)
    cmp x10, x28
    b.hs te_busy                           // a newer event already took it
    stxr w12, x28, [x27]
    cbnz w12, te_claim
    dmb ishst                              // the odd sequence is seen before the contents
    mrs x10, cntvct_el0
    str x10, [x27, #{REC_TICKS}]
    str w25, [x27, #{REC_PROBE}]
    // the thread's id (0 in the shared row): learnt on its first need (thread_tid)
    bl thread_tid
    ldr w9, [x24, #{OFF_RING_ENTRIES}]     // (x9, the position mask, again)
    sub x9, x9, #1
te_tid:
    str w13, [x27, #{REC_TID}]
    ldr x14, [x23], #8                     // argument count; x23 = the first descriptor
    str w14, [x27, #{REC_NARGS}]
    add x15, x27, #{REC_ARGS}
te_arg:
    cbz x14, te_publish
    bl argument_value
    str x0, [x15], #8
    add x23, x23, #16
    sub x14, x14, #1
    b te_arg
te_publish:
    add x10, x28, #1
    stlr x10, [x27]                        // complete: a release store orders the contents first
    b te_event
te_busy:
    clrex
    ldr x14, [x23], #8                     // skip its descriptors
    add x23, x23, x14, lsl #4
    add x11, x26, #{RING_DROPPED}
te_drop:
    ldxr x10, [x11]
    add x10, x10, #1
    stxr w12, x10, [x11]
    cbnz w12, te_drop
    b te_event
te_programs:                               // each event's probe runs its function, if any
    cbz x22, te_return
    sub x22, x22, #1
    ldr x25, [x23], #8                     // probe index; x23 = its argument count
    ldr x14, [x23]
    add x27, x23, #8
    add x27, x27, x14, lsl #4              // x27 = the next event's description
    bl run_program
    mov x23, x27
    b te_programs
te_return:
    ldp x9, x30, [sp, #256]
    msr nzcv, x9
    ldp x2, x3, [sp, #16]
    ldp x4, x5, [sp, #32]
    ldp x6, x7, [sp, #48]
    ldp x8, x9, [sp, #64]
    ldp x10, x11, [sp, #80]
    ldp x12, x13, [sp, #96]
    ldp x14, x15, [sp, #112]
    ldp x18, x19, [sp, #144]
    ldp x20, x21, [sp, #160]
    ldp x22, x23, [sp, #176]
    ldp x24, x25, [sp, #192]
    ldp x26, x27, [sp, #208]
    ldp x28, x29, [sp, #224]
    add sp, sp, #272
    ret

// x23 = descriptor (u8 kind, size, signed, base, index, scale; i64 value),
// x21 = frame (slot n at 8 * n; slot {NO_REGISTER} and above: none, reads 0),
// x24 = region -> x0. Clobbers x9-x13 and the flags.
argument_value:
    ldrb w9, [x23]                         // kind
    ldr x0, [x23, #8]                      // value
    cmp w9, #3
    b.eq av_done                           // a constant
    ldrb w10, [x23, #3]
    mov x11, #0
    cmp w10, #{NO_REGISTER}
    b.hs av_base
    ldr x11, [x21, x10, lsl #3]
av_base:
    cmp w9, #1
    b.ne av_memory
    mov x0, x11                            // a register
    b av_extend
av_memory:                                 // base + index * scale + displacement
    ldrb w10, [x23, #4]
    mov x12, #0
    cmp w10, #{NO_REGISTER}
    b.hs av_index
    ldr x12, [x21, x10, lsl #3]
av_index:
    ldrb w10, [x23, #5]
    madd x11, x12, x10, x11
    add x0, x0, x11
    cmp w9, #4
    b.ne av_load
    ldr x10, [x24, #{OFF_LOAD_BIAS}]       // a link-time address
    add x0, x0, x10
av_load:
    ldrb w10, [x23, #1]
    cmp w10, #8
    b.eq av_load8
    cmp w10, #4
    b.eq av_load4
    cmp w10, #2
    b.eq av_load2
    ldrb w0, [x0]
    b av_extend
av_load2:
    ldrh w0, [x0]
    b av_extend
av_load4:
    ldr w0, [x0]
    b av_extend
av_load8:
    ldr x0, [x0]
    ret
av_extend:
    ldrb w10, [x23, #1]
    ldrb w11, [x23, #2]
    cbz w11, av_unsigned
    cmp w10, #4
    b.eq av_s4
    cmp w10, #2
    b.eq av_s2
    cmp w10, #1
    b.ne av_done
    sxtb x0, w0
    ret
av_s2:
    sxth x0, w0
    ret
av_s4:
    sxtw x0, w0
    ret
av_unsigned:
    cmp w10, #4
    b.eq av_u4
    cmp w10, #2
    b.eq av_u2
    cmp w10, #1
    b.ne av_done
    and x0, x0, #0xff
    ret
av_u2:
    and x0, x0, #0xffff
    ret
av_u4:
    mov w0, w0
av_done:
    ret

// The probe program's function for probe x25, if a tracer loaded one (urewrite run),
// called with its context (trampolines/program_file.py) on the stack. x21 = the
// trace frame, x23 = the probe's argument count then its descriptors, x24 = region,
// x19, x20 = state. Keeps x19-x22, x24 and x27; may clobber the rest but sp.
run_program:
{NO_PROGRAMS}
    add x9, x20, #{PS_PROGRAM}
    ldar x9, [x9]                          // the program, then its maps (set-up stores
    cbz x9, rp_none                        // the maps first)
    ldr x11, [x20, #{PS_PROGRAM_MAPS}]
    cbz x11, rp_none
    ldr x10, [x9, #40]                     // the maps of the same run (a live re-arm may
    ldr x12, [x11, #8]                     // be replacing both)
    cmp x10, x12
    b.ne rp_none
    ldr x10, [x9, #8]                      // the program's probe count
    cmp x25, x10
    b.hs rp_none
    ldr x10, [x9, #16]
    add x10, x9, x10                       // its table
    ldr x10, [x10, x25, lsl #3]
    cbz x10, rp_none
    sub x10, x10, #1
    ldr x12, [x9, #24]
    add x10, x10, x12
    add x26, x9, x10                       // x26 = the function
    mov x25, x9                            // x25 = the program
    sub sp, sp, #{CTX_SIZE} + 16           // the context, and x30
    str x30, [sp, #{CTX_SIZE}]
    str x11, [sp, #{CTX_MAPS}]
    ldr x12, [x25, #56]                    // the arguments the code reads: 1 + how many
    sub x12, x12, #1                       // (0: all)
    cmp x12, #{CTX_ARGUMENTS}
    b.ls rp_read
    mov x12, #{CTX_ARGUMENTS}
rp_read:
    ldr x13, [x23], #8                     // of them, those the probe has, as trace_event's
    cmp x13, x12
    csel x16, x13, x12, ls
    add x17, sp, x12, lsl #3               // (the end of those read: CTX_ARGS is 0)
    mov x15, sp
rp_arg:
    cbz x16, rp_args_zero
    bl argument_value
    str x0, [x15], #8
    add x23, x23, #16
    sub x16, x16, #1
    b rp_arg
rp_args_zero:                              // the probe lacks the rest: they read 0
    cmp x15, x17
    b.hs rp_args_done
    str xzr, [x15], #8
    b rp_args_zero
rp_args_done:
    ldr w10, [x24, #{OFF_PID}]
    str x10, [sp, #{CTX_PID}]
    ldr x10, [x25, #48]                    // what the code reads, and no more
    tbz x10, #{USES_TID_BIT}, rp_no_tid
    bl thread_tid
    str x13, [sp, #{CTX_TID}]
rp_no_tid:
    ldr x10, [x25, #48]
    tbz x10, #{USES_NSECS_BIT}, rp_no_nsecs
    mrs x10, cntvct_el0                    // nsecs: the region's clock pair, then ticks
    ldr x11, [x24, #{OFF_CLOCK_REF_TICKS}]
    sub x10, x10, x11
    ldr x11, [x24, #{OFF_NS_MULT}]         // ns per tick, 32.32
    mul x12, x10, x11
    umulh x10, x10, x11
    extr x10, x10, x12, #32
    ldr x11, [x24, #{OFF_CLOCK_REF_NS}]
    add x10, x10, x11
    str x10, [sp, #{CTX_NSECS}]
rp_no_nsecs:
    ldr x10, [x25, #48]
    tbz x10, #{USES_COMM_BIT}, rp_no_comm
    bl thread_comm
    ldp x10, x11, [x12]                    // (the name is at most 15 bytes and a NUL)
    and x9, x10, #0xff                     // cleared meanwhile by a tracer that saw the
    cbnz x9, rp_named                      // thread renamed: learnt again
    bl thread_comm
    ldp x10, x11, [x12]
rp_named:
    stp x10, x11, [sp, #{CTX_COMM}]
    stp xzr, xzr, [sp, #{CTX_COMM} + 16]
    stp xzr, xzr, [sp, #{CTX_COMM} + 32]
    stp xzr, xzr, [sp, #{CTX_COMM} + 48]
rp_no_comm:
    adr x10, program_event
    str x10, [sp, #{CTX_EVENT}]
    mov x0, sp
    blr x26
    ldr x30, [sp, #{CTX_SIZE}]
    add sp, sp, #{CTX_SIZE} + 16
rp_none:
    ret

// x11 = an owner entry, x24 = region -> x12 = the entry's thread name (in the table
// after the owner table: half an entry's size each). Clobbers x9.
thread_name:
    ldr x12, [x24, #{OFF_OWNERS}]
    sub x9, x11, x24
    sub x9, x9, x12                        // the entry's offset in the owner table
    add x12, x12, x9, lsr #1
    add x12, x12, x24
    mov x9, #{THREAD_NAMES}
    add x12, x12, x9
    ret

// -> x12 = this thread's name (comm), learnt (prctl PR_GET_NAME) on its first need and
// kept in the table after the owner table; the process's name in the shared row.
// x24 = region, x20 = state. Clobbers x0, x8-x11, x13, x16 and the flags.
thread_comm:
    str x30, [sp, #-16]!
    bl thread_tid                          // (a new thread in an old TCB: name forgotten)
    add x12, x20, #{PS_COMM}
    cbz x11, tc_done
    bl thread_name
    ldrb w9, [x12]
    cbnz w9, tc_done
    stp x1, x12, [sp, #-16]!
    mov x0, #16                            // prctl(PR_GET_NAME, name)
    mov x1, x12
    mov x8, #167
    svc #0
    ldp x1, x12, [sp], #16
tc_done:
    ldr x30, [sp], #16
    ret

// -> x13 = this thread's kernel id (0 in the shared row): learnt (gettid) on its first
// need, and again when a new thread has taken over an exited one's TCB and so its
// owner entry (glibc reuses them): the entry keeps where the thread's libc keeps its
// id, the word the kernel clears when the thread exits (prctl PR_GET_TID_ADDRESS),
// which glibc sets for the next thread in the same TCB; a load and a compare check
// it. Looks where slow_hit does: from the hashed entry, {OWNER_PROBES} entries;
// x11 = the entry, or 0. x24 = region. Clobbers x0, x8-x12, x16 and the flags.
thread_tid:
    mov x13, #0
    mrs x10, tpidr_el0
    cbz x10, tt_none
{THREAD_SHARED_TP}
    ldr x11, hash_k
    mul x11, x10, x11
    lsr x11, x11, #{SLOT_SHIFT}
    and x11, x11, #{SLOT_MASK}             // x11 = the hashed entry's offset
    ldr x12, [x24, #{OFF_OWNERS}]
    add x12, x24, x12                      // x12 = the owner table
    mov x16, #{OWNER_PROBES}
tt_owner:
    ldr x9, [x12, x11]
    cbz x9, tt_none                        // a free entry: this thread claimed none
    cmp x9, x10
    b.eq tt_owned
    add x11, x11, #{OWNER_ENTRY_SIZE}
    and x11, x11, #{SLOT_MASK}
    subs x16, x16, #1
    b.ne tt_owner
tt_none:
    mov x11, #0
    ret
tt_owned:
    add x11, x12, x11
    ldr w13, [x11, #{OWNER_TID}]
    cbz w13, tt_learn                      // (its first need)
    ldrsw x9, [x11, #{OWNER_TID_AT}]
    cbz x9, tt_done
    ldr w12, [x10, x9]
    cmp w12, w13
    b.eq tt_done                           // still this thread's
tt_learn:
    str x30, [sp, #-16]!
    bl thread_name                         // a new thread: its name is learnt again too
    ldr x30, [sp], #16
    stp xzr, xzr, [x12]
    mov x8, #178                           // gettid
    svc #0
    mov w13, w0
    str w13, [x11, #{OWNER_TID}]
    str wzr, [x11, #{OWNER_TID_AT}]
    stp xzr, x1, [sp, #-16]!               // [sp]: the word's address; x1 is the caller's
    mov x0, #40                            // prctl(PR_GET_TID_ADDRESS, &address)
    mov x1, sp
    mov x8, #167
    svc #0
    ldp x9, x1, [sp], #16
    cbnz x0, tt_done                       // (a kernel without it: no check)
    cbz x9, tt_done                        // (none set: no check)
    sub x9, x9, x10                        // from the thread pointer
    sxtw x12, w9
    cmp x12, x9
    b.ne tt_done                           // (not within 2 GiB of it: no check)
    cbz x9, tt_done
    ldr w12, [x10, x9]
    cmp w12, w13
    b.ne tt_done                           // (a word that is not the id: no check)
    str w9, [x11, #{OWNER_TID_AT}]
tt_done:
    ret

// A probe program's printf(): an event of probe number {PRINTF_PROBE} + w0 in this
// process's ring, with x2 words from x1 (at most {CTX_ARGUMENTS}), the tracer holding
// the format. Called by the program's code, as an AAPCS64 function: keeps x19-x29.
// (Called through a register: a landing pad, for files whose pages are BTI-guarded.)
// A direct entry's thread id (arch/aarch64/direct_entry.py): x0 = region -> x0 = this
// thread's kernel id, as thread_tid gives it. AAPCS64: keeps x19-x29.
program_tid:
    hint #34                               // bti c
    stp x24, x30, [sp, #-16]!
    mov x24, x0
    bl thread_tid
    mov x0, x13
    ldp x24, x30, [sp], #16
    ret

// A direct entry's thread name: x0 = region, x1 = 64 bytes -> there, the name
// thread_comm gives, NUL-padded. AAPCS64: keeps x19-x29.
program_comm:
    hint #34                               // bti c
    stp x19, x20, [sp, #-48]!
    stp x24, x30, [sp, #16]
    str x1, [sp, #32]
    mov x24, x0
    bl load_state
    bl thread_comm
    ldp x10, x11, [x12]                    // (the name is at most 15 bytes and a NUL)
    and x9, x10, #0xff                     // cleared meanwhile by a tracer that saw the
    cbnz x9, pc_named                      // thread renamed: learnt again
    bl thread_comm
    ldp x10, x11, [x12]
pc_named:
    ldr x1, [sp, #32]
    stp x10, x11, [x1]
    stp xzr, xzr, [x1, #16]
    stp xzr, xzr, [x1, #32]
    stp xzr, xzr, [x1, #48]
    ldp x24, x30, [sp, #16]
    ldp x19, x20, [sp], #48
    ret

program_event:
    hint #34                               // bti c
    stp x19, x20, [sp, #-48]!
    stp x24, x30, [sp, #16]
    stp x21, x22, [sp, #32]
    mov x21, x1
    mov w22, w0
    mov x15, x2
    bl load_state
    ldr x24, [x19]
    cmp x24, #1
    b.ls pe_done
    ldr x14, [x24, #{OFF_RING}]
    cbz x14, pe_done
    add x14, x24, x14                      // x14 = ring
    ldr w10, [x24, #{OFF_RING_ENTRIES}]
    sub x10, x10, #1
pe_head:
    ldxr x11, [x14]                        // take a position: head += 1
    add x12, x11, #1
    stxr w13, x12, [x14]
    cbnz w13, pe_head
    and x12, x11, x10
    add x17, x14, x12, lsl #{RECORD_SHIFT}
    add x17, x17, #{RING_RECORDS}          // x17 = the record
    lsl x7, x11, #1
    add x7, x7, #1                         // x7 = its sequence while written; + 1 when done
pe_claim:
    ldxr x11, [x17]
    tbnz x11, #0, pe_busy                  // another writer is in it (the ring lapped)
    cmp x11, x7
    b.hs pe_busy                           // a newer event already took it
    stxr w12, x7, [x17]
    cbnz w12, pe_claim
    dmb ishst                              // the odd sequence is seen before the contents
    mrs x11, cntvct_el0
    str x11, [x17, #{REC_TICKS}]
    movz w11, #{PRINTF_PROBE_HIGH}, lsl #16
    add w11, w11, w22
    str w11, [x17, #{REC_PROBE}]
    bl thread_tid
    str w13, [x17, #{REC_TID}]
    mov x11, #{CTX_ARGUMENTS}
    cmp x15, x11
    csel x15, x15, x11, ls
    str w15, [x17, #{REC_NARGS}]
    add x11, x17, #{REC_ARGS}
pe_copy:
    cbz x15, pe_publish
    ldr x12, [x21], #8
    str x12, [x11], #8
    sub x15, x15, #1
    b pe_copy
pe_publish:
    add x11, x7, #1
    stlr x11, [x17]                        // complete: a release store orders the contents first
    b pe_done
pe_busy:
    clrex
    add x11, x14, #{RING_DROPPED}
pe_drop:
    ldxr x12, [x11]
    add x12, x12, #1
    stxr w13, x12, [x11]
    cbnz w13, pe_drop
pe_done:
    ldp x21, x22, [sp, #32]
    ldp x24, x30, [sp, #16]
    ldp x19, x20, [sp], #48
    ret

// Maps DIR/TAG.program where `urewrite run` left it, the code of a probe program
// (read and execute); the code file must be a regular file of this process's user or
// root that no one else may write, with this object's probe count. Without one, the
// program built into the probes at rewrite time, if any. Then this process's own maps
// file for it (shared with the tracer, which adds up those of the run). x19, x20 =
// state. -> x0 = 1 when both are mapped: the trace path then runs the program. Keeps
// x15, x19-x30; clobbers x0-x14, x16, x17.
program_setup:
    mov x0, #0
{NO_PROGRAMS}
    // a program of an earlier arming (a live tracer's, or the parent's before fork)
    // ends here; its mappings stay, as a hit may still be running it
    str xzr, [x19, #{DIRECT}]              // (first: no trampoline calls its entries now)
    str xzr, [x20, #{PS_PROGRAM}]
    str xzr, [x20, #{PS_PROGRAM_MAPS}]
    sub sp, sp, #192                       // [sp]: fstat's buffer
    stp x21, x22, [sp, #128]
    stp x23, x24, [sp, #144]
    stp x30, x15, [sp, #160]
    adr x1, program_suffix
    movz x2, #0x8000
    movk x2, #0x8, lsl #16                 // O_RDONLY | O_NOFOLLOW | O_CLOEXEC
    bl program_open
    tbnz x0, #63, ps_built_in
    mov x21, x0                            // x21 = fd
    bl program_file_size
    cmp x0, #0
    b.le ps_close
    mov x22, x0                            // x22 = the program's size (0: built in)
    ldr w9, [sp, #16]                      // st_mode: group or other may write
    mov w10, #0x12
    tst w9, w10
    b.ne ps_close
    // The code goes just below this object where there is room, as on x86_64 (whose
    // branch predictor is slower for targets more than 4 GiB away). Each try is a
    // program's size lower; then anywhere.
    add x12, x22, #4095
    add x12, x12, #4096
    and x12, x12, #-4096                   // the step: the program's pages and a gap
    adr x9, link_table
    ldr x10, [x9]
    sub x9, x9, x10                        // the load bias
    ldr x10, object_lowest
    add x13, x9, x10
    mov x14, #{PROGRAM_TRIES}
ps_try_near:
    subs x13, x13, x12
    b.lo ps_map_anywhere                   // (below address 0)
    cmp x13, #0x10, lsl #12                // (the lowest the kernel gives by default)
    b.lo ps_map_anywhere
    mov x0, x13
    mov x1, x22
    mov x2, #5                             // PROT_READ | PROT_EXEC
    movz x3, #0x2
    movk x3, #0x10, lsl #16                // MAP_PRIVATE | MAP_FIXED_NOREPLACE (a kernel
    mov x4, x21                            // before 4.17: a hint it may not take)
    mov x5, #0
    mov x8, #222                           // mmap
    svc #0
    cmn x0, #17                            // EEXIST: taken
    b.ne ps_mapped
    subs x14, x14, #1
    b.ne ps_try_near
ps_map_anywhere:
    mov x0, #0
    mov x1, x22
    mov x2, #5                             // PROT_READ | PROT_EXEC
    mov x3, #2                             // MAP_PRIVATE
    mov x4, x21
    mov x5, #0
    mov x8, #222                           // mmap
    svc #0
ps_mapped:
    tbnz x0, #63, ps_close
    mov x23, x0                            // x23 = the program
    mov x0, x21
    mov x8, #57                            // close
    svc #0
    ldr x9, program_magic
    ldr x10, [x23]
    cmp x9, x10
    b.ne ps_unmap
    adr x9, link_table                     // this object's probe count (the template's)
    ldr x10, [x9, #16]
    add x10, x9, x10
    ldr w11, [x10, #{OFF_PROBE_COUNT}]
    ldr x12, [x23, #8]
    cmp x12, x11
    b.ne ps_unmap
    ldr x12, [x23, #16]                    // the table and the code lie in the file
    add x12, x12, x11, lsl #3
    cmp x12, x22
    b.hi ps_unmap
    ldr x12, [x23, #24]
    ldr x13, [x23, #32]
    adds x12, x12, x13
    b.cs ps_unmap
    cmp x12, x22
    b.hi ps_unmap
    ldr x12, [x23, #72]                    // and the maps' head, no longer than the maps
    ldr x13, [x23, #80]
    adds x12, x12, x13
    b.cs ps_unmap
    cmp x12, x22
    b.hi ps_unmap
    ldr x12, [x23, #64]
    cmp x13, x12
    b.hi ps_unmap
    b ps_own_maps                          // (the maps: this process's own, below)
ps_map_maps:
    ldr x9, [x23, #64]                     // smaller than the area the code writes
    cmp x24, x9
    b.lo ps_close_unmap
    mov x0, #0
    mov x1, x24
    mov x2, #3                             // PROT_READ | PROT_WRITE
    mov x3, #1                             // MAP_SHARED
    mov x4, x21
    mov x5, #0
    mov x8, #222                           // mmap
    svc #0
    tbnz x0, #63, ps_close_unmap
    ldr x9, maps_magic
    ldr x10, [x0]
    cmp x9, x10
    b.ne ps_unmap_maps
    str x0, [x20, #{PS_PROGRAM_MAPS}]      // the maps first: run_program reads the
    add x9, x20, #{PS_PROGRAM}             // program (acquire), then the maps
    stlr x23, [x9]
    // The direct entries' binding (arch/aarch64/direct_entry.py), the table last
    // (release: the trampolines read it with acquire, then call the entries)
    add x9, x19, #{DIRECT}
    str x0, [x9, #8]
    adr x10, program_event
    str x10, [x9, #16]
    adr x10, program_tid
    str x10, [x9, #24]
    adr x10, program_comm
    str x10, [x9, #32]
    ldr x10, [x23, #{DIRECT_AT}]           // the program's direct table, if it has one
    cbz x10, ps_no_direct
    cbz x22, ps_direct                     // (built in: part of this object, not checked)
    cmp x10, x22
    b.hs ps_no_direct
    adr x11, link_table                    // this object's probe count
    ldr x12, [x11, #16]
    add x12, x11, x12
    ldr w11, [x12, #{OFF_PROBE_COUNT}]
    add x11, x10, x11, lsl #3
    cmp x11, x22
    b.hi ps_no_direct                      // (the table lies in the file)
ps_direct:
    add x10, x23, x10
    stlr x10, [x9]
ps_no_direct:
    mov x0, x21
    mov x8, #57                            // close
    svc #0
    mov x0, #16                            // prctl(PR_GET_NAME): comm
    add x1, x20, #{PS_COMM}
    mov x8, #167
    svc #0
    mov x0, #1
    b ps_done
ps_built_in:
    // No tracer's program: the one built into the probes at rewrite time, if any
    // (its file is part of this object: it is neither mapped nor checked)
    adr x9, link_table
    ldr x10, lt_program
    cbz x10, ps_fail
    add x23, x9, x10
    mov x22, #0                            // (not mapped: nothing to unmap)
    b ps_own_maps
ps_own_maps:
    // This process's own maps, DIR/maps.RUN.UID.PID (0600): the tracer adds up those
    // of its run, so that no two processes write one line of memory (a map entry
    // every process adds into costs ~30 ns a hit in moving between cores), and a
    // process that changed its user needs nothing of anyone else's. A file of this
    // name already (a process before it of the same pid, in this run) is taken on.
    // The name is built in the environment's buffer's second page (free once the
    // environment is read).
    add x0, x20, #3, lsl #12
    bl own_maps_name
    mov x0, #-100                          // AT_FDCWD
    add x1, x20, #3, lsl #12
    movz x2, #0x80c2                       // O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW
    movk x2, #0x8, lsl #16                 // | O_CLOEXEC
    mov x3, #0x180                         // 0600
    mov x8, #56                            // openat
    svc #0
    cmn x0, #17                            // EEXIST
    b.eq ps_own_again
    tbnz x0, #63, ps_unmap
    mov x21, x0
    ldr x1, [x23, #64]                     // the area (its tables start zeroed)
    mov x8, #46                            // ftruncate
    svc #0
    cbnz x0, ps_own_drop
    mov x0, x21
    ldr x1, [x23, #72]
    add x1, x23, x1                        // then its head, from the program file
    ldr x2, [x23, #80]
    mov x3, #0
    mov x8, #68                            // pwrite64
    svc #0
    ldr x9, [x23, #80]
    cmp x0, x9
    b.ne ps_own_drop
    ldr x24, [x23, #64]
    b ps_map_maps
ps_own_again:
    add x0, x20, #3, lsl #12
    bl own_maps_open
    tbnz x0, #63, ps_unmap
    mov x21, x0
    bl program_file_size
    mov x24, x0
    cmp x0, #0
    b.le ps_close_unmap
    b ps_map_maps
ps_own_drop:
    mov x0, #-100                          // AT_FDCWD
    add x1, x20, #3, lsl #12
    mov x2, #0
    mov x8, #35                            // unlinkat
    svc #0
    b ps_close_unmap
ps_unmap_maps:
    mov x1, x24
    mov x8, #215                           // munmap
    svc #0
ps_close_unmap:
    mov x0, x21
    mov x8, #57                            // close
    svc #0
ps_unmap:
    cbz x22, ps_fail                       // (the built-in program)
    mov x0, x23
    mov x1, x22
    mov x8, #215                           // munmap
    svc #0
    b ps_fail
ps_close:
    mov x0, x21
    mov x8, #57                            // close
    svc #0
ps_fail:
    mov x0, #0
ps_done:
    ldp x30, x15, [sp, #160]
    ldp x23, x24, [sp, #144]
    ldp x21, x22, [sp, #128]
    add sp, sp, #192
    ret

// x0 = a buffer, x23 = the program -> DIR "/maps." RUN "." UID "." PID there, NUL-terminated;
// x0 past the NUL. Clobbers x1, x8-x15.
own_maps_name:
    mov x13, x30
    add x1, x20, #{PS_DIR}
    bl append_str
    adr x1, own_maps_prefix
    bl append_str
    ldr x1, [x23, #40]                     // the run
    bl append_decimal
    mov x8, #174                           // getuid
    bl append_dot_call
    mov x8, #172                           // getpid
    bl append_dot_call
    strb wzr, [x0], #1
    mov x30, x13
    ret

// x0 = a path -> x0 = openat(AT_FDCWD, path, O_RDWR | O_NOFOLLOW | O_CLOEXEC): fd or
// -errno. Clobbers x1-x3, x8.
own_maps_open:
    mov x1, x0
    mov x0, #-100                          // AT_FDCWD
    movz x2, #0x8002
    movk x2, #0x8, lsl #16
    mov x3, #0
    mov x8, #56                            // openat
    svc #0
    ret

// openat(DIR "/" TAG SUFFIX, flags), the path built in the environment's buffer
// (free once the environment is read). x1 = the suffix, x2 = the flags. -> x0 = fd
// or -errno. Clobbers x1-x3, x8-x14.
program_open:
    mov x14, x30
    mov x12, x1
    mov x13, x2
    add x0, x20, #2, lsl #12
    add x1, x20, #{PS_DIR}
    bl append_str
    mov w9, #0x2f
    strb w9, [x0], #1
    adr x1, file_tag
    bl append_str
    mov x1, x12
    bl append_str
    strb wzr, [x0]
    mov x0, #-100                          // AT_FDCWD
    add x1, x20, #2, lsl #12
    mov x2, x13
    mov x3, #0
    mov x8, #56                            // openat
    svc #0
    mov x30, x14
    ret

// x21 = fd, the caller's [sp] = a 128-byte buffer for fstat -> x0 = the file's size
// when it is a regular file of this user or root, else -1. Clobbers x1, x8, x9.
program_file_size:
    mov x0, x21
    mov x1, sp
    mov x8, #80                            // fstat
    svc #0
    cbnz x0, pfs_no
    ldr w9, [sp, #16]                      // st_mode
    and w9, w9, #0xf000
    cmp w9, #0x8, lsl #12
    b.ne pfs_no
    mov x8, #174                           // getuid
    svc #0
    ldr w9, [sp, #24]                      // st_uid
    cbz w9, pfs_yes
    cmp w9, w0
    b.ne pfs_no
pfs_yes:
    ldr x0, [sp, #48]                      // st_size
    ret
pfs_no:
    mov x0, #-1
    ret

// A function probed at entry and return was entered: remember when, and at which
// stack pointer (its frame), on this thread's stack of open calls.
// x0 = this thread's row, x16 = region, x17 = the site's sp (+ 1: Go code where x28
// holds the goroutine, lat_enter_g). Preserves every register but x17, and the flags.
// (Called only where the region's flags say latency was asked for.)
lat_enter:
    tbnz x17, #0, lat_enter_g
    sub sp, sp, #48
    stp x9, x10, [sp]
    stp x11, x12, [sp, #16]
    mrs x9, nzcv
    str x9, [sp, #32]
    ldr w9, [x16, #{OFF_PROBE_COUNT}]
    ldr w10, [x16, #{OFF_LATENCY_COUNT}]
    lsl x10, x10, #{HISTOGRAM_SHIFT}
    add x10, x10, x9, lsl #3
    add x9, x0, x10                        // the stack: depth, pad, then {{sp, ticks}} entries
le_drop:                                   // open calls at or below this frame have ended
    ldr x10, [x9]                          // without returning (longjmp): forget them
    cbz x10, le_push
    add x11, x9, x10, lsl #4               // the innermost entry (at 16 * depth)
    ldr x11, [x11]
    cmp x11, x17
    b.hi le_push
    sub x10, x10, #1
    str x10, [x9]
    b le_drop
le_push:
    cmp x10, #{LATENCY_DEPTH}
    b.hs le_done                           // full: this call goes unmeasured
    add x11, x9, x10, lsl #4
    mrs x12, cntvct_el0
    stp x17, x12, [x11, #16]
    add x10, x10, #1
    str x10, [x9]
le_done:
    ldr x9, [sp, #32]
    msr nzcv, x9
    ldp x11, x12, [sp, #16]
    ldp x9, x10, [sp]
    add sp, sp, #48
    ret

// The function returns: drop calls left without a return (their frames lie below
// ours: longjmp, exceptions), and if the innermost open call is ours, add how long
// it took to histogram x1. x0 = row, x16 = region, x17 = the site's sp (+ 1: Go code,
// lat_exit_g). Preserves every register but x17, and the flags.
lat_exit:
    tbnz x17, #0, lat_exit_g
    sub sp, sp, #64
    stp x9, x10, [sp]
    stp x11, x12, [sp, #16]
    stp x13, x14, [sp, #32]
    mrs x9, nzcv
    str x9, [sp, #48]
    ldr w9, [x16, #{OFF_PROBE_COUNT}]
    lsl x9, x9, #3                         // the histograms follow the counters
    ldr w10, [x16, #{OFF_LATENCY_COUNT}]
    lsl x10, x10, #{HISTOGRAM_SHIFT}
    add x10, x10, x9
    add x10, x0, x10                       // the stack
lx_pop:
    ldr x11, [x10]
    cbz x11, lx_missed                     // no open call: our entry was not recorded
    add x12, x10, x11, lsl #4              // the innermost entry
    ldr x13, [x12]
    cmp x13, x17
    b.hs lx_ours
    sub x11, x11, #1                       // below ours: never returned; forget it
    str x11, [x10]
    b lx_pop
lx_ours:
    b.ne lx_missed                         // above ours: our entry was not recorded
    ldr x13, [x12, #8]                     // ticks at entry
    sub x11, x11, #1
    str x11, [x10]
    mrs x12, cntvct_el0
    sub x12, x12, x13
    ldr x13, [x16, #{OFF_NS_MULT}]
    mul x14, x12, x13
    umulh x12, x12, x13
    extr x12, x12, x14, #32                // nanoseconds
    mov x13, #0                            // bucket 0: under 1 ns; k: [2^(k-1), 2^k)
    cbz x12, lx_bucket
    clz x13, x12
    mov x14, #64
    sub x13, x14, x13
    mov x14, #{LATENCY_BUCKETS_MAX}
    cmp x13, x14
    csel x13, x13, x14, ls
lx_bucket:
    add x9, x9, x1, lsl #{HISTOGRAM_SHIFT}
    add x9, x9, x13, lsl #3
    add x9, x0, x9
lx_add:                                    // exclusive, as the counters: a signal handler
    ldxr x12, [x9]                         // returning here meanwhile makes it retry
    add x12, x12, #1
    stxr w13, x12, [x9]
    cbnz w13, lx_add
    b lx_done
lx_missed:                                 // (its stack was full, or it entered on
    add x9, x16, #{OFF_LATENCY_MISSED}     // another thread): the region says how many
lx_missed_add:
    ldxr x12, [x9]
    add x12, x12, #1
    stxr w13, x12, [x9]
    cbnz w13, lx_missed_add
lx_done:
    ldr x9, [sp, #48]
    msr nzcv, x9
    ldp x13, x14, [sp, #32]
    ldp x11, x12, [sp, #16]
    ldp x9, x10, [sp]
    add sp, sp, #64
    ret

// Go code: a goroutine moves between threads mid-call and its stack is copied when
// it grows, so its open calls are kept in the region's table (docs/region.md), keyed
// by g (x28) and stack.hi - sp, which stays the same through both. Only the goroutine
// of g writes entries keyed by g, and it runs on one thread at a time; a free entry
// (0: never used, 1: used before) is claimed with an exclusive pair.

// A Go function measured for latency was entered: its entry at its key, now. Entered
// again at the same key (its prologue runs again after morestack grew the stack),
// the call keeps the later time: one call, one pair. No free entry near its key:
// unmeasured, and its return counts as missed. x16 = region, x17 = the site's sp + 1.
lat_enter_g:
    sub sp, sp, #64
    stp x9, x10, [sp]
    stp x11, x12, [sp, #16]
    stp x13, x14, [sp, #32]
    mrs x9, nzcv
    stp x15, x9, [sp, #48]
    mrs x13, cntvct_el0                    // the time of entry
    sub x9, x17, #1                        // the site's sp
    ldr x10, [x16, #{OFF_GO_CALLS}]
    cbz x10, leg_done
    add x10, x16, x10                      // the table
    cbz x28, leg_done                      // no goroutine (a signal on a C thread)
    ldp x11, x12, [x28]                    // its stack: lo, hi
    cmp x9, x11
    b.lo leg_done                          // not on the goroutine's stack (a signal
    cmp x9, x12                            // handler's): no key that lasts
    b.hs leg_done
    sub x12, x12, x9                       // the key: stack.hi - sp
    add x11, x28, x12
    ldr x9, hash_k
    mul x11, x11, x9
    lsr x11, x11, #{GO_CALL_SHIFT}
    lsl x11, x11, #{GO_CALL_SIZE_SHIFT}     // the key's first entry
leg_search:                                // the first entry that is ours (entered again)
    mov x9, x11                            // or free: one of ours past a free one is an
    mov x15, #{GO_CALL_PROBES}             // older call's; a return finds the newer first
leg_probe:
    ldr x17, [x10, x9]
    cmp x17, x28
    b.ne leg_other
    add x17, x10, x9
    ldr x17, [x17, #8]
    cmp x17, x12
    b.eq leg_again
    b leg_next
leg_other:
    cmp x17, #1
    b.ls leg_claim                         // free: 0 never used, 1 used before
leg_next:
    add x9, x9, #{GO_CALL_SIZE}
    and x9, x9, #{GO_CALLS_MASK}
    subs x15, x15, #1
    b.ne leg_probe
    b leg_done                             // full near the key
leg_claim:
    add x14, x10, x9
leg_exclusive:
    ldxr x17, [x14]
    cmp x17, #1
    b.hi leg_lost
    stxr w15, x28, [x14]
    cbnz w15, leg_exclusive
    stp x12, x13, [x14, #8]
    b leg_done
leg_lost:                                  // taken since: look again
    clrex
    b leg_search
leg_again:
    add x17, x10, x9
    str x13, [x17, #16]
leg_done:
    ldp x15, x9, [sp, #48]
    msr nzcv, x9
    ldp x13, x14, [sp, #32]
    ldp x11, x12, [sp, #16]
    ldp x9, x10, [sp]
    add sp, sp, #64
    ret

// A Go function measured for latency returns: its entry at its key gives the sample,
// added to histogram x1 of row x0 (exclusive: the thread's own row, or the shared
// row, as a goroutine's pair needs no row of its own); no entry: missed, counted.
// x16 = region, x17 = the site's sp + 1.
lat_exit_g:
    sub sp, sp, #64
    stp x9, x10, [sp]
    stp x11, x12, [sp, #16]
    stp x13, x14, [sp, #32]
    mrs x9, nzcv
    stp x15, x9, [sp, #48]
    mrs x13, cntvct_el0                    // now
    sub x9, x17, #1                        // the site's sp
    ldr x10, [x16, #{OFF_GO_CALLS}]
    cbz x10, lxg_missed
    add x10, x16, x10                      // the table
    cbz x28, lxg_missed                    // no goroutine (a signal on a C thread)
    ldp x11, x12, [x28]                    // its stack: lo, hi
    cmp x9, x11
    b.lo lxg_missed                        // not on the goroutine's stack (a signal
    cmp x9, x12                            // handler's): no key that lasts
    b.hs lxg_missed
    sub x12, x12, x9                       // the key: stack.hi - sp
    add x11, x28, x12
    ldr x9, hash_k
    mul x11, x11, x9
    lsr x11, x11, #{GO_CALL_SHIFT}
    lsl x11, x11, #{GO_CALL_SIZE_SHIFT}     // the key's first entry
    mov x9, x11
    mov x15, #{GO_CALL_PROBES}
lxg_probe:
    ldr x17, [x10, x9]
    cmp x17, x28
    b.ne lxg_other
    add x17, x10, x9
    ldr x14, [x17, #8]
    cmp x14, x12
    b.eq lxg_found
    b lxg_next
lxg_other:
    cbz x17, lxg_missed                    // never used: no entry lies beyond it
lxg_next:
    add x9, x9, #{GO_CALL_SIZE}
    and x9, x9, #{GO_CALLS_MASK}
    subs x15, x15, #1
    b.ne lxg_probe
    b lxg_missed
lxg_found:
    ldr x14, [x17, #16]                    // ticks at entry
    mov x15, #1
    str x15, [x17]                         // free again
    sub x13, x13, x14
    ldr x14, [x16, #{OFF_NS_MULT}]
    mul x15, x13, x14
    umulh x13, x13, x14
    extr x13, x13, x15, #32                // nanoseconds
    mov x14, #0
    cbz x13, lxg_bucket
    clz x14, x13
    mov x15, #64
    sub x14, x15, x14
    mov x15, #{LATENCY_BUCKETS_MAX}
    cmp x14, x15
    csel x14, x14, x15, ls
lxg_bucket:
    ldr w9, [x16, #{OFF_PROBE_COUNT}]
    lsl x9, x9, #3
    add x9, x9, x1, lsl #{HISTOGRAM_SHIFT}
    add x9, x9, x14, lsl #3
    add x9, x0, x9
lxg_add:
    ldxr x12, [x9]
    add x12, x12, #1
    stxr w13, x12, [x9]
    cbnz w13, lxg_add
    b lxg_done
lxg_missed:
    add x9, x16, #{OFF_LATENCY_MISSED}
lxg_missed_add:
    ldxr x12, [x9]
    add x12, x12, #1
    stxr w13, x12, [x9]
    cbnz w13, lxg_missed_add
lxg_done:
    ldp x15, x9, [sp, #48]
    msr nzcv, x9
    ldp x13, x14, [sp, #32]
    ldp x11, x12, [sp, #16]
    ldp x9, x10, [sp]
    add sp, sp, #64
    ret

// Set-up from a trampoline in Go code: lazy_init on a stack of its own in the state
// page, since it needs more than a goroutine's stack may hold below sp (docs/design.md,
// "Go's stacks"). One set-up at a time uses that stack: a hit meanwhile (another
// thread's, or a signal handler's on this one) leaves the set-up to it, uncounted
// unless it finds the probes armed. Uses 32 bytes of the caller's stack; every
// register and the flags are preserved (nothing here sets them).
lazy_init_aside:
    stp x9, x10, [sp, #-32]!
    str x11, [sp, #16]
    adr x9, link_table
    ldr x10, [x9, #8]
    add x9, x9, x10
    add x9, x9, #{ASIDE_BUSY}
lia_claim:
    ldaxr x10, [x9]
    cbnz x10, lia_busy
    mov x10, #1
    stxr w11, x10, [x9]
    cbnz w11, lia_claim
    mov x11, sp
    str x11, [x9, #8]                      // the sp it came from
    add x11, x9, #{ASIDE_TOP} - {ASIDE_BUSY}
    mov sp, x11
    str x30, [sp, #-16]!
    bl lazy_init
    ldr x30, [sp], #16
    ldr x11, [x9, #8]
    mov sp, x11
    stlr xzr, [x9]
    b lia_done
lia_busy:
    clrex
lia_done:
    ldr x11, [sp, #16]
    ldp x9, x10, [sp], #32
    ret

// -- Return-address redirection (return probes of functions whose exits cannot be
// patched). Each thread keeps a shadow stack in private memory, which a forked child
// copies with the frames it still has to return from. A stack is u64 depth, u64
// reserved, then entries {{u64 sp, u64 return address}}: sp is the function's sp at
// its entry (its caller's sp at the call), which it has again when it returns: the
// key its return stub finds the entry by. The table of stacks, {{u64 thread pointer,
// u64 stack}}, lives in the state memory that survives fork.

// -> x2 = this thread's shadow stack, or 0 (no thread pointer, the table is full,
// or the stack could not be mapped). x4 = 1: a thread without one claims a table
// entry and maps its stack (the one system call, at its first redirected call).
// Clobbers x0-x5, x8-x11, x19, x20 and the flags.
shadow_stack:
    mov x11, x30
    bl load_state
    mov x30, x11
    add x3, x20, #{PS_SHADOW_PAGES}, lsl #12   // x3 = the table
    mov x2, #0
    mrs x9, tpidr_el0
    cbz x9, ss_done
{SHADOW_SHARED_TP}
    ldr x10, hash_k
    mul x10, x9, x10
    lsr x10, x10, #{SHADOW_SHIFT}          // the first entry to look at
    mov x5, #{SHADOW_THREADS}
ss_look:
    add x0, x3, x10, lsl #4                // x0 = the entry {{thread, stack}}
    ldr x1, [x0]
    cmp x1, x9
    b.eq ss_mine
    cbz x1, ss_free
ss_next:
    add x10, x10, #1
    and x10, x10, #{SHADOW_MASK}
    subs x5, x5, #1
    b.ne ss_look
ss_done:
    ret
ss_mine:
    ldr x2, [x0, #8]                       // 0 while its owner maps it (a signal handler
    ret                                    // on that thread then does not redirect)
ss_free:
    cbz x4, ss_done                        // entries are never freed: a thread that had
ss_claim:                                  // one would have met it before a free one
    ldaxr x1, [x0]
    cbnz x1, ss_taken
    stlxr w1, x9, [x0]
    cbnz w1, ss_claim
    mov x10, x0
    mov x0, #0
    movz x1, #{SHADOW_MAP_LOW}
    movk x1, #{SHADOW_MAP_HIGH}, lsl #16
    mov x2, #3                             // PROT_READ | PROT_WRITE
    mov x3, #0x4022                        // MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
    mov x4, #-1
    mov x5, #0
    mov x8, #222                           // mmap
    svc #0
    mov x2, #0
    tbnz x0, #63, ss_done                  // no memory: this thread never redirects
    str x0, [x10, #8]
    mov x2, x0
    ret
ss_taken:
    clrex
    cmp x1, x9
    b.eq ss_mine
    b ss_next                              // another thread took it meanwhile

// x2 = a shadow stack, x1 = a key (sp) -> x0 = the index of the topmost entry for
// that key, or -1. Clobbers x3 and the flags.
shadow_find:
    ldr x0, [x2]
sf_next:
    subs x0, x0, #1
    b.mi sf_done
    add x3, x2, x0, lsl #4
    ldr x3, [x3, #16]
    cmp x3, x1
    b.ne sf_next
sf_done:
    ret

// A function whose return address is redirected was entered, and counted: called
// by its trampoline, whose frame is at sp (the function's sp at sp + {TRAMPOLINE_FRAME},
// its return address at [sp + {TF_LR}]); x16 = region, x17 = its return stub.
// Keeps the return address on this thread's shadow stack and puts the stub in its
// place, for the trampoline to load into x30. When x30 holds the function's own stub
// already (it was tail-called by itself, or by a function it tail-called), the entry
// keeps the stub: the stub then runs once per entry, a return counted for each call,
// as exit-site patching counts the tail call and the final `ret`. Not redirected
// (no stack, or a full one): the region counts the call as missed. Preserves every
// register but x17, and the flags.
shadow_push:
    sub sp, sp, #112
    stp x0, x1, [sp]
    stp x2, x3, [sp, #16]
    stp x4, x5, [sp, #32]
    stp x8, x9, [sp, #48]
    stp x10, x11, [sp, #64]
    stp x19, x20, [sp, #80]
    mrs x9, nzcv
    stp x30, x9, [sp, #96]
    mov x4, #1
    bl shadow_stack
    cbz x2, sp_missed
    ldr x0, [x2]                           // depth
    mov x1, #{SHADOW_DEPTH}
    cmp x0, x1
    b.hs sp_missed
    add x1, x0, #1
    str x1, [x2]                           // take the entry first: a signal handler's
    add x0, x2, x0, lsl #4                 // calls meanwhile push above it
    add x3, sp, #112                       // the trampoline's frame
    add x1, x3, #{TRAMPOLINE_FRAME}        // the key: the function's sp
    ldr x5, [x3, #{TF_LR}]                 // its return address
    stp x1, x5, [x0, #16]
    str x17, [x3, #{TF_LR}]                // it now returns to the stub
    b sp_done
sp_missed:                                 // not redirected: this return is not seen,
    add x0, x16, #{OFF_RETURNS_MISSED}     // so the region says how many were missed
sp_missed_add:
    ldxr x1, [x0]
    add x1, x1, #1
    stxr w2, x1, [x0]
    cbnz w2, sp_missed_add
sp_done:
    ldp x30, x9, [sp, #96]
    msr nzcv, x9
    ldp x19, x20, [sp, #80]
    ldp x10, x11, [sp, #64]
    ldp x8, x9, [sp, #48]
    ldp x4, x5, [sp, #32]
    ldp x2, x3, [sp, #16]
    ldp x0, x1, [sp]
    add sp, sp, #112
    ret

// A redirected function returned into its stub, which calls us with its frame at
// sp, laid out as a trampoline's: the function's sp, the key, at sp + {TRAMPOLINE_FRAME}.
// Stores the original return address at [sp + {TF_LR}] and takes its entry off the
// shadow stack, with the entries above it (frames left by longjmp or an exception:
// they never return). Preserves every register but x16, x17 (the stub restores
// those), and the flags.
shadow_pop:
    sub sp, sp, #112
    stp x0, x1, [sp]
    stp x2, x3, [sp, #16]
    stp x4, x5, [sp, #32]
    stp x8, x9, [sp, #48]
    stp x10, x11, [sp, #64]
    stp x19, x20, [sp, #80]
    mrs x9, nzcv
    stp x30, x9, [sp, #96]
    mov x4, #0
    bl shadow_stack
    add x16, sp, #112                      // the stub's frame
    add x1, x16, #{TRAMPOLINE_FRAME}       // the key
    cbz x2, spop_elsewhere
    bl shadow_find
    tbnz x0, #63, spop_elsewhere
    add x3, x2, x0, lsl #4
    ldr x5, [x3, #24]                      // read before the entry is given back
    str x0, [x2]
    str x5, [x16, #{TF_LR}]
    b spop_done
// Not on this thread's stack: its thread pointer changed since the call (a static
// program's start-up hands the stand-in TCB over to libc's). Look on every stack,
// and mark the entry taken (no key is odd) rather than move another thread's depth.
spop_elsewhere:
    add x8, x20, #{PS_SHADOW_PAGES}, lsl #12
    mov x9, #{SHADOW_THREADS}
spe_next:
    ldr x2, [x8, #8]
    cbz x2, spe_skip
    bl shadow_find
    tbz x0, #63, spe_found
spe_skip:
    add x8, x8, #16
    subs x9, x9, #1
    b.ne spe_next
    // Nowhere (a stack that moved between threads, say): the return address is
    // lost. Stop with a message rather than run on.
    mov x0, #2
    adr x1, lost_message
    mov x2, #{LOST_MESSAGE_SIZE}
    mov x8, #64                            // write
    svc #0
    .word 0                                // udf #0: SIGILL
spe_found:
    add x3, x2, x0, lsl #4
    ldr x5, [x3, #24]
    mov x4, #1
    str x4, [x3, #16]
    str x5, [x16, #{TF_LR}]
spop_done:
    ldp x30, x9, [sp, #96]
    msr nzcv, x9
    ldp x19, x20, [sp, #80]
    ldp x10, x11, [sp, #64]
    ldp x8, x9, [sp, #48]
    ldp x4, x5, [sp, #32]
    ldp x2, x3, [sp, #16]
    ldp x0, x1, [sp]
    add sp, sp, #112
    ret
lost_message:
    .ascii "{LOST_MESSAGE}"
    .byte 10
    .p2align 3

// this backend's own entry points, read back by runtime.py (the shared table follows)
arm64_exports:
    .quad trace_event_go
    .quad shadow_push
    .quad shadow_pop
