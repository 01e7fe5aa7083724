# urewrite x86_64 runtime: assembled by Keystone (Intel syntax) into every rewritten file.
#
# It runs once per process (start-up hook, or lazily after fork) and on the rare
# slow hit path. It uses only raw system calls: no libc, no loader support.
# Fields in braces are filled in by runtime.py before assembly.
#
# State memory (zero-filled, private to the process):
#   page 0 is cleared in a forked child (MADV_WIPEONFORK), so the child sets up
#   a region of its own:       [0] region address, or 1 = disarmed, 0 = not set up
#                              [16] 1 when the region has an event ring (tracing)
#                              [8] set-up in progress: fs base of the thread doing it
#                              [{DIRECT}] the direct entries' binding (5 words, the table last)
#                              [{ASIDE_BUSY}] lazy_init_aside's stack in use, [{ASIDE_SP}] the rsp
#                              it came from; that stack: [{ASIDE_BOTTOM}, {ASIDE_TOP})
#   later pages survive fork:  PS_STARTED, FSBASE_USABLE (rdfsbase may run), PS_LATENCY
#                              (latency asked for), PS_TCB (a stand-in thread control block
#                              before libc sets one up), PS_DIR (value of the
#                              environment variable), PS_NAME, PS_ENVBUF

link_table:
lt_self:     .quad 0          # link-time address of link_table
lt_state:    .quad 0          # state memory - link_table
lt_template: .quad 0          # region template - link_table
lt_tsize:    .quad 0          # template size
lt_rsize:    .quad 0          # region size
lt_program:  .quad 0          # a program built into the probes - link_table, or 0
file_tag:    .byte {TAG_BYTES}
program_suffix: .asciz "{PROGRAM_SUFFIX}"
own_maps_prefix: .asciz "/{OWN_MAPS_PREFIX}"
var_name:    .ascii "{ENV_VAR}="
trace_var_name: .ascii "{TRACE_VAR}="
latency_var_name: .ascii "{LATENCY_VAR}="
proc_environ: .ascii "/proc/self/environ"
             .byte 0
clock_file:  .ascii "{CLOCK_FILE}"
             .byte 0

# rbx <- state memory
load_state:
    lea rbx, [rip + link_table]
    add rbx, qword ptr [rip + lt_state]
    ret

# Start-up hook for executables (the new e_entry): [rsp] = argc, then argv, envp.
exe_start:
    .byte 0xf3, 0x0f, 0x1e, 0xfa          # endbr64
{SAVE_ALL}
    call load_state
    mov rax, qword ptr [rsp + {SAVED_BYTES}]       # argc, above the saved registers
    lea rdi, [rsp + rax*8 + {SAVED_BYTES} + 16]    # envp = &argv[argc + 1]
    call capture_env_vector
    call ensure_thread_pointer
    call setup_region
{RESTORE_ALL}
exe_tail:
    .byte 0xcc, 0xcc, 0xcc, 0xcc, 0xcc     # becomes: jmp <original entry point>

# Start-up hook for shared objects (the new DT_INIT): continues at the original one.
dso_start:
    .byte 0xf3, 0x0f, 0x1e, 0xfa          # endbr64
    call lazy_init
dso_tail:
    .byte 0xcc, 0xcc, 0xcc, 0xcc, 0xcc     # becomes: jmp <original DT_INIT>

# Set-up from a trampoline (or dso_start): every register is preserved.
lazy_init:
{SAVE_ALL}
    call load_state
    cmp qword ptr [rbx + {PS_STARTED}], 0
    jne lazy_have_env
    call capture_env_proc
lazy_have_env:
    call setup_region
{RESTORE_ALL}
    ret

# rdi = envp array: records our variables from it.
capture_env_vector:
    mov qword ptr [rbx + {PS_STARTED}], 1
cev_next:
    mov rsi, qword ptr [rdi]
    test rsi, rsi
    jz cev_done
    add rdi, 8
    push rdi
    call consider_var
    pop rdi
    jmp cev_next
cev_done:
    add rdi, 8                             # the auxiliary vector follows envp's NULL
cev_auxv:
    mov rax, qword ptr [rdi]
    test rax, rax                          # AT_NULL
    jz cev_auxv_done
    add rdi, 16
    cmp rax, 26                            # AT_HWCAP2
    jne cev_auxv
    test byte ptr [rdi - 8], 2             # HWCAP2_FSGSBASE: rdfsbase may run
    jz cev_auxv_done
    mov byte ptr [rbx + {FSBASE_USABLE}], 1
cev_auxv_done:
    ret

# Reads /proc/self/environ into PS_ENVBUF and records our variables from it.
capture_env_proc:
    mov qword ptr [rbx + {PS_STARTED}], 1
    lea rdi, [rip + proc_environ]
    mov esi, 0x80000                       # O_RDONLY | O_CLOEXEC
    xor edx, edx
    mov eax, 2                             # open
    syscall
    test rax, rax
    js cep_done
    mov r8, rax                            # fd
    lea r9, [rbx + {PS_ENVBUF}]            # write position
cep_read:
    mov rdi, r8
    mov rsi, r9
    lea rdx, [rbx + {PS_ENVBUF} + {ENVBUF_SIZE} - 1]
    sub rdx, r9
    jz cep_close
    xor eax, eax                           # read
    syscall
    test rax, rax
    jle cep_close
    add r9, rax
    jmp cep_read
cep_close:
    mov byte ptr [r9], 0
    mov rdi, r8
    mov eax, 3                             # close
    syscall
    lea r10, [rbx + {PS_ENVBUF}]           # r10 = current string, r9 = end
cep_scan:
    cmp r10, r9
    jae cep_done
    mov rsi, r10
    call consider_var
cep_skip:
    cmp byte ptr [r10], 0
    lea r10, [r10 + 1]
    jne cep_skip
    jmp cep_scan
cep_done:
    ret

# rsi = "NAME=value": records the value if NAME is one of ours.
# Clobbers rax, rcx, rdx, rsi, rdi, r11.
consider_var:
    push rsi
    lea r11, [rip + var_name]
    mov ecx, {ENV_VAR_LEN}
    call match_prefix
    test rsi, rsi
    jz cv_trace
    add rsp, 8
    jmp copy_dir
cv_trace:
    mov rsi, qword ptr [rsp]
    lea r11, [rip + trace_var_name]
    mov ecx, {TRACE_VAR_LEN}
    call match_prefix
    test rsi, rsi
    jz cv_latency
    add rsp, 8
    xor eax, eax                           # the ring size, in decimal
cv_digit:
    movzx edx, byte ptr [rsi]
    sub edx, 0x30
    cmp edx, 9
    ja cv_number
    imul rax, rax, 10
    add rax, rdx
    inc rsi
    cmp rax, {RING_MAX}
    jbe cv_digit
cv_number:
    mov qword ptr [rbx + {PS_TRACE}], rax
    ret
cv_latency:
    pop rsi
    lea r11, [rip + latency_var_name]
    mov ecx, {LATENCY_VAR_LEN}
    call match_prefix
    test rsi, rsi
    jz cv_done
    xor eax, eax                           # timed unless the value is empty or "0..."
    movzx ecx, byte ptr [rsi]
    test ecx, ecx
    jz cv_timed
    cmp ecx, 0x30
    je cv_timed
    inc eax
cv_timed:
    mov byte ptr [rbx + {PS_LATENCY}], al
cv_done:
    ret

# rsi = candidate, r11 = prefix, ecx = its length -> rsi = what follows it, or 0
match_prefix:
    mov al, byte ptr [rsi]
    cmp al, byte ptr [r11]
    jne mp_no
    inc rsi
    inc r11
    dec ecx
    jnz match_prefix
    ret
mp_no:
    xor esi, esi
    ret

# rsi = value -> PS_DIR; a value longer than {DIR_MAX} bytes disarms (never a cut path)
copy_dir:
    lea rdi, [rbx + {PS_DIR}]
    mov ecx, {DIR_MAX}
cd_loop:
    mov al, byte ptr [rsi]
    test al, al
    jz cd_end
    mov byte ptr [rdi], al
    inc rsi
    inc rdi
    dec ecx
    jnz cd_loop
    mov byte ptr [rbx + {PS_DIR_TOO_LONG}], 1
cd_end:
    mov byte ptr [rdi], 0
    ret

# A statically linked program starts with no thread pointer (fs base 0) until
# libc sets one; trampolines read fs:[0], so give it a stand-in until then.
ensure_thread_pointer:
    sub rsp, 8
    mov rsi, rsp
    mov edi, 0x1003                        # ARCH_GET_FS
    mov eax, 158                           # arch_prctl
    syscall
    pop rax
    test rax, rax
    jnz etp_done
    lea rsi, [rbx + {PS_TCB}]
    mov qword ptr [rsi], rsi               # the TLS ABI: fs:[0] holds the thread pointer
    mov edi, 0x1002                        # ARCH_SET_FS
    mov eax, 158
    syscall
etp_done:
    ret

# Creates and maps this process's region, or marks the probes disarmed.
setup_region:
    cld
    cmp qword ptr [rbx], 0
    jne sr_ret
    # No thread pointer yet (a hit while the loader relocates, before TLS exists):
    # stay unarmed and try again on a later hit; the hit path reads fs:[0].
    sub rsp, 8
    mov rsi, rsp
    mov edi, 0x1003                        # ARCH_GET_FS
    mov eax, 158                           # arch_prctl
    syscall
    pop r8                                 # r8 = fs base: identifies this thread
    test r8, r8
    jz sr_ret
    # One thread sets up; the others wait for it. The same thread again means a
    # signal handler interrupted its own set-up: that hit goes uncounted.
sr_claim:
    xor eax, eax
    lock cmpxchg qword ptr [rbx + 8], r8
    je sr_owned
    cmp rax, r8
    je sr_ret
    pause
    cmp qword ptr [rbx], 0
    jne sr_ret
    jmp sr_claim
sr_owned:
    cmp qword ptr [rbx], 0                 # set up by another thread meanwhile
    je sr_setup
    mov qword ptr [rbx + 8], 0
    ret
sr_setup:
    mov rdi, rbx
    mov esi, 4096
    mov edx, 18                            # MADV_WIPEONFORK
    mov eax, 28                            # madvise
    syscall
    cmp byte ptr [rbx + {PS_DIR}], 0
    je sr_disarm
    cmp byte ptr [rbx + {PS_DIR_TOO_LONG}], 0
    jne sr_disarm
    # A set-user-ID or set-group-ID program must not create files where its caller says.
    mov eax, 102                           # getuid
    syscall
    mov r8, rax
    mov eax, 107                           # geteuid
    syscall
    cmp rax, r8
    jne sr_disarm
    mov eax, 104                           # getgid
    syscall
    mov r8, rax
    mov eax, 108                           # getegid
    syscall
    cmp rax, r8
    jne sr_disarm
    # name = DIR "/" TAG "." PID [ "-" N ] ".ure"
    lea rdi, [rbx + {PS_NAME}]
    lea rsi, [rbx + {PS_DIR}]
    call append_str
    mov byte ptr [rdi], 0x2f
    inc rdi
    lea rsi, [rip + file_tag]
    call append_str
    mov eax, 39                            # getpid
    call append_dot_call
    push rax                               # [rsp] = pid
    mov r9, rdi
    xor r8d, r8d                           # attempt: the same pid after exec gets "-1", "-2", ...
sr_try:
    mov rdi, r9
    test r8, r8
    jz sr_suffix
    mov byte ptr [rdi], 0x2d
    lea eax, [r8 + 0x30]
    mov byte ptr [rdi + 1], al
    add rdi, 2
sr_suffix:
    mov dword ptr [rdi], 0x6572752e        # ".ure"
    mov byte ptr [rdi + 4], 0
    lea rdi, [rbx + {PS_NAME}]
    mov esi, 0x800c2                       # O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC
    mov edx, 0x180                         # 0600: traced arguments are the program's data
    mov eax, 2                             # open
    syscall
    cmp rax, -17                           # EEXIST
    jne sr_opened
    inc r8
    cmp r8, 10
    jb sr_try
    jmp sr_disarm_pid
sr_opened:
    test rax, rax
    js sr_disarm_pid
    push rax                               # [rsp] = fd, [rsp+8] = pid
    # under `urewrite trace`, an event ring follows the counters: its entries,
    # a power of two in [{RING_MIN}, {RING_MAX}], go to r12 (saved by our callers)
    xor r12d, r12d
    mov rcx, qword ptr [rbx + {PS_TRACE}]
    test rcx, rcx
    jz sr_size
    mov r12d, {RING_MIN}
sr_ring_round:
    cmp r12, rcx
    jae sr_size
    shl r12, 1
    jmp sr_ring_round
sr_size:
    mov rsi, r12
    shl rsi, {RECORD_SHIFT}
    jz sr_no_ring
    add rsi, {RING_RECORDS}
sr_no_ring:
    add rsi, qword ptr [rip + lt_rsize]
    mov r13, rsi                           # r13 = region size
    mov rdi, rax
    mov eax, 77                            # ftruncate
    syscall
    test rax, rax
    js sr_close_disarm
    # the template (header, probe table, names) written into the file, not copied
    # through the mapping: its pages are never faulted into this process
    mov rdi, qword ptr [rsp]
    lea rsi, [rip + link_table]
    add rsi, qword ptr [rip + lt_template]
    mov rdx, qword ptr [rip + lt_tsize]
    xor r10d, r10d
    mov eax, 18                            # pwrite64
    syscall
    cmp rax, qword ptr [rip + lt_tsize]
    jne sr_close_disarm                    # (a short write: no room left)
    xor edi, edi
    mov rsi, r13
    mov edx, 3                             # PROT_READ | PROT_WRITE
    mov r10d, 1                            # MAP_SHARED
    mov r8, qword ptr [rsp]
    xor r9d, r9d
    mov eax, 9                             # mmap
    syscall
    mov r10, rax                           # r10 = region
    pop rdi
    mov eax, 3                             # close
    syscall
    cmp r10, -4096
    ja sr_disarm_pid
    pop rax
    mov dword ptr [r10 + {OFF_PID}], eax
    lea rax, [rip + link_table]
    sub rax, qword ptr [rip + lt_self]
    mov qword ptr [r10 + {OFF_LOAD_BIAS}], rax
    cmp byte ptr [rbx + {PS_LATENCY}], 0   # latency asked for: lat_enter and lat_exit time calls
    je sr_untimed
    or dword ptr [r10 + {OFF_FLAGS}], {FLAG_LATENCY}
sr_untimed:
    # enable the probed USDT semaphores: the table after the template (8-aligned)
    lea rsi, [rip + link_table]
    add rsi, qword ptr [rip + lt_template]
    add rsi, qword ptr [rip + lt_tsize]
    add rsi, 7
    and rsi, -8
    mov rcx, qword ptr [rsi]
sr_semaphore:
    test rcx, rcx
    jz sr_semaphores_done
    add rsi, 8
    mov rdx, qword ptr [rsi]
    lock add word ptr [rdx + rax], 1
    dec rcx
    jmp sr_semaphore
sr_semaphores_done:
    # owner table: each per-thread slot points at its counter row
    mov rdi, r10
    add rdi, qword ptr [r10 + {OFF_OWNERS}]
    mov rax, r10
    add rax, qword ptr [r10 + {OFF_COUNTERS}]
    mov ecx, dword ptr [r10 + {OFF_SLOT_COUNT}]
sr_owner:
    mov qword ptr [rdi + 8], rax
    add rdi, {OWNER_ENTRY_SIZE}
    add rax, qword ptr [r10 + {OFF_SLOT_STRIDE}]
    dec ecx
    jnz sr_owner
    mov qword ptr [r10 + {OFF_REGION_SIZE}], r13
    test r12, r12
    jz sr_untraced
    mov rax, qword ptr [rip + lt_rsize]
    mov dword ptr [r10 + {OFF_RING_ENTRIES}], r12d
    mov qword ptr [r10 + {OFF_RING}], rax  # last: readers see the ring, then read the rest
    # fault the ring's pages in now, not one per 32 events on the hit path
    # (MADV_POPULATE_WRITE, Linux 5.14; where it is refused, touch each page)
    lea rdi, [r10 + rax]
    mov rsi, r13
    sub rsi, rax
    mov edx, 23
    mov eax, 28                            # madvise
    syscall
    test rax, rax
    jz sr_ring_ready
sr_touch_ring:
    or byte ptr [rdi], 0                   # a write that keeps the byte
    add rdi, 4096
    sub rsi, 4096
    ja sr_touch_ring
sr_ring_ready:
    mov qword ptr [rbx + 16], 1            # tracing
    call program_setup
    jmp sr_calibrate
sr_untraced:
    mov qword ptr [rbx + 16], 0            # a live re-arm without tracing: no ring now
    call program_setup                     # a probe program takes the trace path too
    test eax, eax
    jnz sr_calibrate
    test byte ptr [r10 + {OFF_FLAGS}], {FLAG_LATENCY}
    jz sr_publish
    cmp dword ptr [r10 + {OFF_LATENCY_COUNT}], 0
    je sr_publish
sr_calibrate:                              # events and latencies need the clock
    call clock_setup
sr_publish:
    mov qword ptr [rbx], r10               # publish: stores before it are visible first (x86 TSO)
    mov qword ptr [rbx + 8], 0
sr_ret:
    ret
sr_close_disarm:
    pop rdi
    mov eax, 3
    syscall
sr_disarm_pid:
    pop rax
sr_disarm:
    mov qword ptr [rbx], 1
    mov qword ptr [rbx + 8], 0
    ret

# rsi = NUL-terminated string, appended at rdi (rdi ends on the terminator position)
append_str:
    mov al, byte ptr [rsi]
    test al, al
    jz as_end
    mov byte ptr [rdi], al
    inc rsi
    inc rdi
    jmp append_str
as_end:
    ret

# [rsp + 8] = value, appended at rdi in decimal
append_decimal:
    mov rax, qword ptr [rsp + 8]
    mov r11d, 10
    xor ecx, ecx
ad_div:
    xor edx, edx
    div r11
    add edx, 0x30
    push rdx
    inc ecx
    test rax, rax
    jnz ad_div
ad_out:
    pop rax
    mov byte ptr [rdi], al
    inc rdi
    dec ecx
    jnz ad_out
    ret

# eax = a system call of no argument (getpid, getuid): "." and its result in decimal,
# appended at rdi (as append_decimal); rax = the result. Clobbers rcx, rdx, r11.
append_dot_call:
    mov byte ptr [rdi], 0x2e
    inc rdi
    syscall
    push rax
    call append_decimal
    pop rax
    ret

# -> rcx = this thread's identity, as the trampolines compute it: its thread pointer
# (fs:[0], the TLS ABI's self pointer); where that word is 0 (Go points fs at its
# own per-thread data), its fs base, read with rdfsbase where the kernel allows it;
# else 0: no identity (counts go to the shared row). Clobbers flags only.
thread_identity:
    .byte 0x64, 0x48, 0x8b, 0x0c, 0x25, 0, 0, 0, 0   # mov rcx, fs:[0] (Keystone makes it RIP-relative)
    test rcx, rcx
    jnz ti_done
    push rbx
    call load_state
    cmp byte ptr [rbx + {FSBASE_USABLE}], 0
    pop rbx
    je ti_done
    .byte 0xf3, 0x48, 0x0f, 0xae, 0xc1    # rdfsbase rcx
ti_done:
    ret

# The row of a thread whose hashed owner entry is not its own: rdx = region,
# rcx = thread pointer, rsi = that entry's offset in the owner table. Looks at
# {OWNER_PROBES} entries from there (wrapping) for the thread's own, else claims a
# free one. -> rsi = the thread's row and ZF = 1, or rsi = the shared row and
# ZF = 0 (all taken by other threads, or no thread pointer). Clobbers rsi and flags.
slow_hit:
    test rcx, rcx
    jz sh_shared
    push rax
    push rdi
    push r8
    mov r8d, {OWNER_PROBES}
sh_entry:
    lea rdi, [rdx + rsi]
    add rdi, qword ptr [rdx + {OFF_OWNERS}]
    mov rax, qword ptr [rdi]
    cmp rax, rcx
    je sh_own
    test rax, rax
    jnz sh_next
    lock cmpxchg qword ptr [rdi], rcx      # free (rax = 0): claim it for this thread
    je sh_claimed
sh_next:                                   # another thread's: look at the next one
    add esi, {OWNER_ENTRY_SIZE}
    and esi, {SLOT_MASK}
    dec r8d
    jnz sh_entry
    pop r8
    pop rdi
    pop rax
sh_shared:
    mov esi, dword ptr [rdx + {OFF_SLOT_COUNT}]
    imul rsi, qword ptr [rdx + {OFF_SLOT_STRIDE}]
    add rsi, qword ptr [rdx + {OFF_COUNTERS}]
    add rsi, rdx
    test rsp, rsp                          # ZF = 0: the shared row
    ret
sh_claimed:                                # (its id is learnt on first need: thread_owner)
sh_own:
    mov rsi, qword ptr [rdi + 8]
    pop r8
    pop rdi
    pop rax
    cmp esi, esi                           # ZF = 1: the thread's own row
    ret

# The clock of events and latencies: a TSC reading paired with CLOCK_MONOTONIC, and
# the TSC's rate (an invariant TSC is assumed). The rate is the machine's: the first
# process of a region directory measures it (2 ms of waiting) and leaves it in the
# directory's clock file for the ones after it, which read it instead (docs/region.md).
# r10 = region, rbx = state. Clobbers rax, rcx, rdx, rsi, rdi, r8, r9, r11, r14, r15.
clock_setup:
    call clock_pair
    mov qword ptr [r10 + {OFF_CLOCK_REF_TICKS}], rax
    mov qword ptr [r10 + {OFF_CLOCK_REF_NS}], rdx
    call read_clock_file
    test rax, rax
    jnz cs_rate
    call calibrate_clock
    call write_clock_file
cs_rate:
    mov qword ptr [r10 + {OFF_CLOCK_HZ}], rax
    mov dword ptr [r10 + {OFF_CLOCK_KIND}], {CLOCK_KIND}
    mov rcx, rax                           # ns per tick, 32.32 fixed point
    mov rax, 1000000000
    shl rax, 32
    xor edx, edx
    div rcx
    mov qword ptr [r10 + {OFF_NS_MULT}], rax
    ret

# Waits 2 ms from the region's clock pair and pairs the clocks again: -> rax = ticks
# per second; the later pair becomes the region's.
calibrate_clock:
    mov r14, qword ptr [r10 + {OFF_CLOCK_REF_TICKS}]
    mov r15, qword ptr [r10 + {OFF_CLOCK_REF_NS}]
cc_wait:
    call clock_pair
    mov rcx, rdx
    sub rcx, r15
    cmp rcx, 2000000
    jb cc_wait
    mov qword ptr [r10 + {OFF_CLOCK_REF_TICKS}], rax
    mov qword ptr [r10 + {OFF_CLOCK_REF_NS}], rdx
    sub rax, r14                           # ticks elapsed
    mov r14, rcx                           # ns elapsed
    mov ecx, 1000000000
    mul rcx
    div r14
    ret

# -> rax = a descriptor of the region directory (O_PATH), or a negative errno
open_directory:
    lea rdi, [rbx + {PS_DIR}]
    mov esi, 0x290000                      # O_PATH | O_DIRECTORY | O_CLOEXEC
    xor edx, edx
    mov eax, 2                             # open
    syscall
    ret

# -> rax = the rate in the directory's clock file, or 0 unless the file is a regular
# file of this user (or root), whole, with a plausible rate that the TSC has kept
# since the file's clock pair (a file left by another boot or machine fails this).
read_clock_file:
    mov eax, 107                           # geteuid
    syscall
    mov r8d, eax
    call open_directory
    test rax, rax
    js rcf_none
    mov r14, rax
    mov rdi, rax
    lea rsi, [rip + clock_file]
    mov edx, 0xa0000                       # O_RDONLY | O_NOFOLLOW | O_CLOEXEC
    mov eax, 257                           # openat
    syscall
    mov r15, rax
    mov rdi, r14
    mov eax, 3                             # close
    syscall
    test r15, r15
    js rcf_none
    sub rsp, 192                           # [rsp]: struct stat; [rsp + 144]: the file
    mov rdi, r15
    mov rsi, rsp
    mov eax, 5                             # fstat
    syscall
    test rax, rax
    jnz rcf_close
    mov eax, dword ptr [rsp + 24]          # st_mode
    and eax, 0xf000
    cmp eax, 0x8000                        # S_IFREG
    jne rcf_close
    mov eax, dword ptr [rsp + 28]          # st_uid
    test eax, eax
    jz rcf_read
    cmp eax, r8d
    jne rcf_close
rcf_read:
    mov rdi, r15
    lea rsi, [rsp + 144]
    mov edx, 33
    xor eax, eax                           # read
    syscall
    mov r14, rax
    mov rdi, r15
    mov eax, 3                             # close
    syscall
    cmp r14, 32
    jne rcf_free
    mov rax, {CLOCK_FILE_MAGIC}
    cmp qword ptr [rsp + 144], rax
    jne rcf_free
    mov r8, qword ptr [rsp + 152]          # the rate
    cmp r8, 1000000
    jb rcf_free
    mov rax, r8
    shr rax, 40
    jnz rcf_free
    mov r9, qword ptr [r10 + {OFF_CLOCK_REF_TICKS}]
    sub r9, qword ptr [rsp + 160]          # ticks since the file's pair
    jb rcf_free
    mov rcx, qword ptr [r10 + {OFF_CLOCK_REF_NS}]
    sub rcx, qword ptr [rsp + 168]         # ns since it
    jb rcf_free
    cmp rcx, 1000000
    jb rcf_agrees                          # under 1 ms: too close to tell
    mov rax, r9                            # the rate since then, within 1/64 of the file's
    mov r11d, 1000000000
    mul r11
    cmp rdx, rcx
    jae rcf_free
    div rcx
    sub rax, r8
    jns rcf_difference
    neg rax
rcf_difference:
    mov rcx, r8
    shr rcx, 6
    cmp rax, rcx
    ja rcf_free
rcf_agrees:
    mov rax, r8
    add rsp, 192
    ret
rcf_close:
    mov rdi, r15
    mov eax, 3                             # close
    syscall
rcf_free:
    add rsp, 192
rcf_none:
    xor eax, eax
    ret

# Leaves the rate (rax, preserved) and the region's clock pair in the directory's
# clock file, for the processes after this one: in place of any file there (which
# read_clock_file refused), created whole or not at all by each writer.
write_clock_file:
    push rax
    push r10                               # (openat's fourth argument)
    sub rsp, 32
    mov rcx, {CLOCK_FILE_MAGIC}
    mov qword ptr [rsp], rcx
    mov qword ptr [rsp + 8], rax
    mov rcx, qword ptr [r10 + {OFF_CLOCK_REF_TICKS}]
    mov qword ptr [rsp + 16], rcx
    mov rcx, qword ptr [r10 + {OFF_CLOCK_REF_NS}]
    mov qword ptr [rsp + 24], rcx
    call open_directory
    test rax, rax
    js wcf_done
    mov r14, rax
    mov rdi, rax
    lea rsi, [rip + clock_file]
    xor edx, edx
    mov eax, 263                           # unlinkat
    syscall
    mov rdi, r14
    lea rsi, [rip + clock_file]
    mov edx, 0xa00c1                       # O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC
    mov r10d, 0x1a4                        # 0644: the rate is no secret
    mov eax, 257                           # openat
    syscall
    mov r15, rax
    mov rdi, r14
    mov eax, 3                             # close
    syscall
    test r15, r15
    js wcf_done
    mov rdi, r15
    mov rsi, rsp
    mov edx, 32
    mov eax, 1                             # write
    syscall
    mov rdi, r15
    mov eax, 3                             # close
    syscall
wcf_done:
    add rsp, 32
    pop r10
    pop rax
    ret

# -> rax = TSC, rdx = CLOCK_MONOTONIC in ns, read together: of 4 tries, the one whose
# clock_gettime two TSC reads bracket most closely, with the TSC of the bracket's middle.
# (One TSC read after the syscall was late by whatever ran between them: on a busy
# machine the syscall's return may be preempted for milliseconds, and over the 2 ms of
# calibrate_clock that skewed every latency of the process by a third or more.)
clock_pair:
    push rbx
    push r12
    push r13
    push r8
    sub rsp, 32                            # [rsp]: timespec; [rsp + 16]: the TSC before
    mov r8d, 4                             # tries
    mov rbx, -1                            # the narrowest bracket so far, in ticks
cp_try:
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov qword ptr [rsp + 16], rax
    mov edi, 1                             # CLOCK_MONOTONIC
    mov rsi, rsp
    mov eax, 228                           # clock_gettime
    syscall
    rdtsc
    shl rdx, 32
    or rax, rdx
    sub rax, qword ptr [rsp + 16]          # the bracket
    cmp rax, rbx
    jae cp_next                            # (unsigned: the first try is always kept)
    mov rbx, rax
    shr rax, 1
    add rax, qword ptr [rsp + 16]
    mov r12, rax                           # its middle
    imul rdx, qword ptr [rsp], 1000000000
    add rdx, qword ptr [rsp + 8]
    mov r13, rdx
cp_next:
    dec r8d
    jnz cp_try
    mov rax, r12
    mov rdx, r13
    add rsp, 32
    pop r8
    pop r13
    pop r12
    pop rbx
    ret

# One event into the ring. rdi = the site's registers (frame slots, see
# trampoline.py), esi = probe, rdx = argument descriptors, rcx = the site's rsp.
# May clobber every register but rsp: the trampoline restores them.
trace_event:
    mov r12, rdi
    mov r13d, esi
    mov r14, rdx
    mov r15, rcx
    call load_state
    mov r8, qword ptr [rbx]                # region: read again, so a live tracer may have
    cmp r8, 1                              # disarmed (1) or re-armed (0, or a region
    jbe te_skip                            # without a ring) since the hit was counted
    cmp qword ptr [rbx + {PS_PROGRAM}], 0  # a probe program's hits: no event of their own
    jne run_program                        # (its ring holds its printf()s)
    call ring_claim
    test eax, eax
    jz te_skip
    mov dword ptr [r10 + {REC_PROBE}], r13d
    call thread_owner
    mov dword ptr [r10 + {REC_TID}], esi
    mov rcx, qword ptr [r14]               # argument count
    mov dword ptr [r10 + {REC_NARGS}], ecx
    lea rsi, [r14 + 8]
    lea rdi, [r10 + {REC_ARGS}]
te_arg:
    test rcx, rcx
    jz te_done
    push rcx
    call argument_value
    pop rcx
    mov qword ptr [rdi], rax
    add rdi, 8
    add rsi, 16
    dec rcx
    jmp te_arg
te_done:
    lea rax, [r11 + 1]
    mov qword ptr [r10 + {REC_SEQ}], rax   # complete (a release store on x86)
    ret
te_skip:                                   # no ring to write to: the event is not recorded
    ret

# Claims the next record of the region's ring, its time written. r8 = region ->
# eax = 1, r10 = the record, r11 = its sequence while written (store r11 + 1 when
# done); or eax = 0: no ring, or no record free (counted as dropped). r9 = the ring.
# Clobbers rax, rcx, rdx.
ring_claim:
    mov r9, qword ptr [r8 + {OFF_RING}]
    test r9, r9
    jz rc_none
    add r9, r8                             # ring
    mov eax, 1
    lock xadd qword ptr [r9 + {RING_HEAD}], rax
    mov ecx, dword ptr [r8 + {OFF_RING_ENTRIES}]
    dec ecx
    mov r10, rax
    and r10, rcx
    shl r10, {RECORD_SHIFT}
    lea r10, [r9 + r10 + {RING_RECORDS}]   # the record
    lea r11, [rax*2 + 1]                   # its sequence while written; + 1 when done
rc_claim:
    mov rax, qword ptr [r10 + {REC_SEQ}]
    test al, 1
    jnz rc_drop                            # another writer is in it (the ring lapped)
    cmp rax, r11
    jae rc_drop                            # a newer event already took it
    lock cmpxchg qword ptr [r10 + {REC_SEQ}], r11
    jne rc_claim
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov qword ptr [r10 + {REC_TICKS}], rax
    mov eax, 1
    ret
rc_drop:
    lock inc qword ptr [r9 + {RING_DROPPED}]
rc_none:
    xor eax, eax
    ret

# -> rdi = this thread's entry in the owner table, or 0 (a thread in the shared row),
# esi = its kernel thread id (0 in the shared row): learnt once (learn_tid), and again
# when a new thread has taken over an exited one's TCB and so its entry.
# (Looking where slow_hit does: from the hashed entry, {OWNER_PROBES} entries.)
# r8 = region. Clobbers rax, rcx, rdx.
thread_owner:
    xor esi, esi
    xor edi, edi
    call thread_identity
    test rcx, rcx
    jz to_done
    movabs rdx, {HASH_MULTIPLIER}
    imul rdx, rcx
    shr rdx, {SLOT_SHIFT}
    and edx, {SLOT_MASK}
    mov rdi, qword ptr [r8 + {OFF_OWNERS}]
    add rdi, r8                            # the owner table
    mov eax, {OWNER_PROBES}
to_look:
    cmp qword ptr [rdi + rdx], rcx
    je to_found
    add edx, {OWNER_ENTRY_SIZE}
    and edx, {SLOT_MASK}
    dec eax
    jnz to_look
    xor edi, edi
    jmp to_done
to_found:
    add rdi, rdx
    mov esi, dword ptr [rdi + {OWNER_TID}]
    test esi, esi
    jz to_learn                            # (a row claimed while untraced)
    movsxd rdx, dword ptr [rdi + {OWNER_TID_AT}]
    test rdx, rdx
    jz to_done
    cmp esi, dword ptr [rcx + rdx]         # still this thread's? glibc gives an exited
    je to_done                             # thread's TCB, so its entry, to a new thread
to_learn:
    call learn_tid
to_done:
    ret

# r8 = region, rdi = an owner entry -> rax = the entry's thread name (the table after
# the owner table: half an entry's size each). Clobbers flags.
thread_name:
    mov rax, rdi
    sub rax, r8
    sub rax, qword ptr [r8 + {OFF_OWNERS}] # the entry's offset in the owner table
    shr rax, 1
    add rax, qword ptr [r8 + {OFF_OWNERS}]
    lea rax, [r8 + rax + {THREAD_NAMES}]
    ret

# -> rsi = this thread's name (comm), learnt (prctl PR_GET_NAME) on its first need and
# kept in the table after the owner table; the process's name in the shared row.
# r8 = region, rbx = state. Clobbers rax, rcx, rdx, rdi, r11 and flags.
thread_comm:
    call thread_owner                      # (a new thread in an old TCB: name forgotten)
    lea rsi, [rbx + {PS_COMM}]
    test rdi, rdi
    jz tc_done
    call thread_name
    mov rsi, rax
    cmp byte ptr [rsi], 0
    jne tc_done
    mov edi, 16                            # prctl(PR_GET_NAME, name)
    mov eax, 157
    syscall
tc_done:
    ret

# rdi = a thread's owner entry, rcx = its thread identity -> esi = its kernel thread id,
# learnt now (gettid), and where its libc keeps it: the word the kernel clears when the
# thread exits (prctl PR_GET_TID_ADDRESS), which glibc sets to the id of the next thread
# it starts in the same TCB, so thread_owner sees that thread (a load and a compare).
# Kept as an offset from the thread identity where the word holds the id now; else 0.
# Preserves every register but rax, rsi and flags.
learn_tid:
    push rcx                               # the thread identity
    push rdx
    push rdi                               # the entry
    push r11
    call thread_name                       # (a new thread: the name is learnt again too)
    mov qword ptr [rax], 0
    mov qword ptr [rax + 8], 0
    push 0                                 # [rsp]: the word's address, from prctl
    mov eax, 186                           # gettid
    syscall
    mov rdi, qword ptr [rsp + 16]
    mov dword ptr [rdi + {OWNER_TID}], eax
    mov dword ptr [rdi + {OWNER_TID_AT}], 0
    push rax                               # the id; the address now at [rsp + 8]
    mov edi, 40                            # prctl(PR_GET_TID_ADDRESS, &address)
    lea rsi, [rsp + 8]
    mov eax, 157
    syscall
    pop rsi                                # esi = the id
    test rax, rax
    jnz lt_done                            # (a kernel without it: no check)
    mov rax, qword ptr [rsp]
    test rax, rax
    jz lt_done                             # (none set: no check)
    mov rdx, qword ptr [rsp + 32]
    sub rax, rdx                           # from the thread identity
    movsxd rcx, eax
    cmp rcx, rax
    jne lt_done                            # (not within 2 GiB of it: no check)
    test rax, rax
    jz lt_done
    cmp dword ptr [rdx + rax], esi
    jne lt_done                            # (a word that is not the id: no check)
    mov rdi, qword ptr [rsp + 16]
    mov dword ptr [rdi + {OWNER_TID_AT}], eax
lt_done:
    add rsp, 8
    pop r11
    pop rdi
    pop rdx
    pop rcx
    ret

# The probe program's function for probe r13d, if a tracer loaded one (urewrite run):
# called with its context (trampolines/program_file.py) on the stack. The same
# registers as trace_event: r12 = frame, r13d = probe, r14 = argument descriptors,
# r15 = the site's rsp, r8 = region, rbx = state. May clobber every register but rsp.
run_program:
{NO_PROGRAMS}
    cmp r8, 1
    jbe rp_none
    mov r9, qword ptr [rbx + {PS_PROGRAM}]
    test r9, r9
    jz rp_none
    mov r11, qword ptr [rbx + {PS_PROGRAM_MAPS}]   # its maps: the same run's (a live
    test r11, r11                                  # re-arm may be replacing both)
    jz rp_none
    mov rax, qword ptr [r9 + 40]
    cmp rax, qword ptr [r11 + 8]
    jne rp_none
    mov ecx, r13d
    cmp rcx, qword ptr [r9 + 8]            # the program's probe count
    jae rp_none
    mov rax, qword ptr [r9 + 16]
    add rax, r9                            # its table
    mov rax, qword ptr [rax + rcx * 8]
    test rax, rax
    jz rp_none
    dec rax
    add rax, qword ptr [r9 + 24]
    add rax, r9                            # the function
    sub rsp, {CTX_SIZE} + 8                # the context, and the function's address
    mov qword ptr [rsp + {CTX_SIZE}], rax
    mov qword ptr [rsp + {CTX_MAPS}], r11
    mov rdx, qword ptr [r9 + 56]           # the arguments the code reads: 1 + how many
    dec rdx                                # (0: all)
    cmp rdx, {CTX_ARGUMENTS}
    jbe rp_read
    mov edx, {CTX_ARGUMENTS}
rp_read:
    mov rcx, qword ptr [r14]               # of them, those the probe has, as trace_event's
    cmp rcx, rdx
    cmova rcx, rdx
    lea rdx, [rsp + {CTX_ARGS} + rdx * 8]  # (the end of those read)
    lea rsi, [r14 + 8]
    lea rdi, [rsp + {CTX_ARGS}]
rp_arg:
    test rcx, rcx
    jz rp_args_zero
    push rcx
    push rdx
    push rdi
    call argument_value
    pop rdi
    pop rdx
    pop rcx
    mov qword ptr [rdi], rax
    add rdi, 8
    add rsi, 16
    dec rcx
    jmp rp_arg
rp_args_zero:                              # the probe lacks the rest: they read 0
    cmp rdi, rdx
    jae rp_args_done
    mov qword ptr [rdi], 0
    add rdi, 8
    jmp rp_args_zero
rp_args_done:
    mov eax, dword ptr [r8 + {OFF_PID}]
    mov qword ptr [rsp + {CTX_PID}], rax
    test byte ptr [r9 + 48], {USES_TID}    # what the code reads, and no more (r9: the program)
    jz rp_no_tid
    call thread_owner                      # (the shared row's: 0)
    mov qword ptr [rsp + {CTX_TID}], rsi
rp_no_tid:                                 # (nor anything it does not read)
    test byte ptr [r9 + 48], {USES_NSECS}
    jz rp_no_nsecs
    rdtsc                                  # nsecs: the region's clock pair, then ticks
    shl rdx, 32
    or rax, rdx
    sub rax, qword ptr [r8 + {OFF_CLOCK_REF_TICKS}]
    imul qword ptr [r8 + {OFF_NS_MULT}]    # ns per tick, 32.32
    shrd rax, rdx, 32
    add rax, qword ptr [r8 + {OFF_CLOCK_REF_NS}]
    mov qword ptr [rsp + {CTX_NSECS}], rax
rp_no_nsecs:
    test byte ptr [r9 + 48], {USES_COMM}
    jz rp_no_comm
    call thread_comm
    mov rax, qword ptr [rsi]
    test al, al                            # cleared meanwhile by a tracer that saw the
    jnz rp_named                           # thread renamed: learnt again
    call thread_comm
    mov rax, qword ptr [rsi]
rp_named:
    mov qword ptr [rsp + {CTX_COMM}], rax
    mov rax, qword ptr [rsi + 8]
    mov qword ptr [rsp + {CTX_COMM} + 8], rax
    xor eax, eax                           # (the name is at most 15 bytes and a NUL)
    mov qword ptr [rsp + {CTX_COMM} + 16], rax
    mov qword ptr [rsp + {CTX_COMM} + 24], rax
    mov qword ptr [rsp + {CTX_COMM} + 32], rax
    mov qword ptr [rsp + {CTX_COMM} + 40], rax
    mov qword ptr [rsp + {CTX_COMM} + 48], rax
    mov qword ptr [rsp + {CTX_COMM} + 56], rax
rp_no_comm:
    lea rax, [rip + program_event]
    mov qword ptr [rsp + {CTX_EVENT}], rax
    mov rdi, rsp
    call qword ptr [rsp + {CTX_SIZE}]
    add rsp, {CTX_SIZE} + 8
rp_none:
    ret

# A direct entry's thread id (arch/x86_64/direct_entry.py): rdi = region -> rax =
# this thread's kernel id, as thread_owner gives it. Keeps rbx, rbp, r12-r15 (SysV).
program_tid:
    mov r8, rdi
    call thread_owner
    mov eax, esi
    ret

# A direct entry's thread name: rdi = region, rsi = 64 bytes -> there, the name
# thread_comm gives, NUL-padded. Keeps rbx, rbp, r12-r15 (SysV).
program_comm:
    push rbx
    push rsi
    mov r8, rdi
    call load_state
    call thread_comm
    mov rax, qword ptr [rsi]
    test al, al                            # cleared meanwhile by a tracer that saw the
    jnz pc_named                           # thread renamed: learnt again
    call thread_comm
    mov rax, qword ptr [rsi]
pc_named:
    pop rdi
    mov qword ptr [rdi], rax
    mov rax, qword ptr [rsi + 8]
    mov qword ptr [rdi + 8], rax
    xor eax, eax                           # (the name is at most 15 bytes and a NUL)
    mov qword ptr [rdi + 16], rax
    mov qword ptr [rdi + 24], rax
    mov qword ptr [rdi + 32], rax
    mov qword ptr [rdi + 40], rax
    mov qword ptr [rdi + 48], rax
    mov qword ptr [rdi + 56], rax
    pop rbx
    ret

# A probe program's printf(): an event of probe number {PRINTF_PROBE} + edi in this
# process's ring, with rdx words from rsi (at most {CTX_ARGUMENTS}), the tracer holding
# the format. Called by the program's code, as a SysV function: keeps rbx, rbp, r12-r15.
program_event:
    push rbx
    push r12
    push r13
    push r14
    mov r12, rsi
    mov r13d, edi
    mov r14, rdx
    call load_state
    mov r8, qword ptr [rbx]
    cmp r8, 1
    jbe pe_done
    call ring_claim
    test eax, eax
    jz pe_done
    lea eax, [r13 + {PRINTF_PROBE}]
    mov dword ptr [r10 + {REC_PROBE}], eax
    call thread_owner
    mov dword ptr [r10 + {REC_TID}], esi
    mov rcx, r14
    cmp rcx, {CTX_ARGUMENTS}
    jbe pe_count
    mov ecx, {CTX_ARGUMENTS}
pe_count:
    mov dword ptr [r10 + {REC_NARGS}], ecx
    mov rsi, r12
    lea rdi, [r10 + {REC_ARGS}]
    rep movsq
    lea rax, [r11 + 1]
    mov qword ptr [r10 + {REC_SEQ}], rax   # complete (a release store on x86)
pe_done:
    pop r14
    pop r13
    pop r12
    pop rbx
    ret

# Maps DIR/TAG.program where `urewrite run` left it (else the program built in), the
# code of a probe program (read and execute), and this process's own maps file for it
# (shared with the tracer, which adds up those of the run). The code file must be a
# regular file of this process's user or root that no one else may write, with this
# object's probe count. rbx = state, r10 = region. -> eax = 1 when both are mapped:
# the trace path then runs the program. Clobbers rax, rcx, rdx, rsi, rdi, r8, r9, r11.
program_setup:
    xor eax, eax
{NO_PROGRAMS}
    # a program of an earlier arming (a live tracer's, or the parent's before fork)
    # ends here; its mappings stay, as a hit may still be running it
    mov qword ptr [rbx + {DIRECT}], 0      # (first: no trampoline calls its entries now)
    mov qword ptr [rbx + {PS_PROGRAM}], 0
    mov qword ptr [rbx + {PS_PROGRAM_MAPS}], 0
    push r10
    push r12
    push r13
    push r14
    push r15
    sub rsp, 160                           # [rsp]: fstat's buffer; [rsp + 144]: the program's size
    mov r15, r10
    lea rsi, [rip + program_suffix]
    mov edx, 0xa0000                       # O_RDONLY | O_NOFOLLOW | O_CLOEXEC
    call program_open
    test rax, rax
    js ps_built_in
    mov r13, rax
    call program_file_size
    test rax, rax
    jle ps_close
    mov qword ptr [rsp + 144], rax
    test byte ptr [rsp + 24], 0x12         # st_mode: group or other may write
    jnz ps_close
    # The code goes just below this object where there is room: AMD's Zen 4 predicts a
    # branch to a target more than 4 GiB away ~1 ns slower (the trampolines call it on
    # every hit), and an executable's mmap area is terabytes away. Each try is a
    # program's size lower; then anywhere.
    lea r14, [rax + 0x1fff]
    and r14, -4096                         # the step: the program's pages and a gap
    movabs rdi, {OBJECT_LOWEST}
    add rdi, qword ptr [r15 + {OFF_LOAD_BIAS}]
    mov r12d, {PROGRAM_TRIES}
ps_try_near:
    sub rdi, r14
    jb ps_map_anywhere                     # (below address 0)
    cmp rdi, 0x10000                       # (the lowest the kernel gives by default)
    jb ps_map_anywhere
    push rdi
    mov rsi, qword ptr [rsp + 152]
    mov edx, 5                             # PROT_READ | PROT_EXEC
    mov r10d, 0x100002                     # MAP_PRIVATE | MAP_FIXED_NOREPLACE (a kernel
    mov r8, r13                            # before 4.17: a hint it may not take)
    xor r9d, r9d
    mov eax, 9                             # mmap
    syscall
    pop rdi
    cmp rax, -17                           # EEXIST: taken
    jne ps_mapped
    dec r12d
    jnz ps_try_near
ps_map_anywhere:
    xor edi, edi
    mov rsi, qword ptr [rsp + 144]
    mov edx, 5                             # PROT_READ | PROT_EXEC
    mov r10d, 2                            # MAP_PRIVATE
    mov r8, r13
    xor r9d, r9d
    mov eax, 9                             # mmap
    syscall
ps_mapped:
    cmp rax, -4096
    ja ps_close
    mov r12, rax
    mov rdi, r13
    mov eax, 3                             # close
    syscall
    movabs rcx, {PROGRAM_MAGIC}
    cmp qword ptr [r12], rcx
    jne ps_unmap
    mov ecx, dword ptr [r15 + {OFF_PROBE_COUNT}]
    cmp qword ptr [r12 + 8], rcx
    jne ps_unmap
    mov rax, qword ptr [r12 + 16]          # the table and the code lie in the file
    lea rax, [rax + rcx * 8]
    cmp rax, qword ptr [rsp + 144]
    ja ps_unmap
    mov rax, qword ptr [r12 + 24]
    add rax, qword ptr [r12 + 32]
    jc ps_unmap
    cmp rax, qword ptr [rsp + 144]
    ja ps_unmap
    mov rax, qword ptr [r12 + 72]          # and the maps' head
    add rax, qword ptr [r12 + 80]
    jc ps_unmap
    cmp rax, qword ptr [rsp + 144]
    ja ps_unmap
    mov rax, qword ptr [r12 + 80]
    cmp rax, qword ptr [r12 + 64]
    ja ps_unmap
    jmp ps_own_maps                        # (the maps: this process's own, below)
ps_map_maps:
    cmp r14, qword ptr [r12 + 64]          # smaller than the area the code writes
    jb ps_close_unmap
    xor edi, edi
    mov rsi, r14
    mov edx, 3                             # PROT_READ | PROT_WRITE
    mov r10d, 1                            # MAP_SHARED
    mov r8, r13
    xor r9d, r9d
    mov eax, 9                             # mmap
    syscall
    cmp rax, -4096
    ja ps_close_unmap
    movabs rcx, {MAPS_MAGIC}
    cmp qword ptr [rax], rcx
    jne ps_unmap_maps
    mov qword ptr [rbx + {PS_PROGRAM_MAPS}], rax  # (the maps first: run_program reads
    mov qword ptr [rbx + {PS_PROGRAM}], r12        # the program, then the maps)
    # The direct entries' binding (arch/x86_64/direct_entry.py), the table last: from
    # then on the trampolines call the entries (each checks the maps are its run's)
    mov qword ptr [rbx + {DIRECT} + 8], rax
    lea rcx, [rip + program_event]
    mov qword ptr [rbx + {DIRECT} + 16], rcx
    lea rcx, [rip + program_tid]
    mov qword ptr [rbx + {DIRECT} + 24], rcx
    lea rcx, [rip + program_comm]
    mov qword ptr [rbx + {DIRECT} + 32], rcx
    mov rdx, qword ptr [r12 + {DIRECT_AT}]  # the program's direct table, if it has one
    test rdx, rdx
    jz ps_no_direct
    mov rsi, qword ptr [rsp + 144]
    test rsi, rsi
    jz ps_direct                           # (built in: part of this object, not checked)
    cmp rdx, rsi
    jae ps_no_direct
    mov ecx, dword ptr [r15 + {OFF_PROBE_COUNT}]
    lea rcx, [rdx + rcx * 8]
    cmp rcx, rsi
    ja ps_no_direct                        # (the table lies in the file)
ps_direct:
    add rdx, r12
    mov qword ptr [rbx + {DIRECT}], rdx
ps_no_direct:
    mov rdi, r13
    mov eax, 3                             # close
    syscall
    mov edi, 16                            # prctl(PR_GET_NAME): comm
    lea rsi, [rbx + {PS_COMM}]
    mov eax, 157
    syscall
    mov qword ptr [rbx + 16], 1            # the trace path
    mov eax, 1
    jmp ps_done
ps_built_in:
    # No tracer's program: the one built into the probes at rewrite time, if any
    # (its file is part of this object: it is neither mapped nor checked)
    mov rax, qword ptr [rip + lt_program]
    test rax, rax
    jz ps_fail
    lea r12, [rip + link_table]
    add r12, rax
    mov qword ptr [rsp + 144], 0           # (not mapped: nothing to unmap)
    jmp ps_own_maps
ps_own_maps:
    # This process's own maps, DIR/maps.RUN.UID.PID (0600): the tracer adds up those
    # of its run, so that no two processes write one line of memory (a map entry
    # every process adds into costs ~30 ns a hit in moving between cores), and a
    # process that changed its user needs nothing of anyone else's. A file of this
    # name already (a process before it of the same pid, in this run) is taken on.
    lea rdi, [rbx + {PS_ENVBUF} + 4096]
    call own_maps_name
    lea rdi, [rbx + {PS_ENVBUF} + 4096]
    mov esi, 0xa00c2                       # O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC
    mov edx, 0x180                         # 0600
    mov eax, 2                             # open
    syscall
    cmp rax, -17                           # EEXIST
    je ps_own_again
    test rax, rax
    js ps_unmap
    mov r13, rax
    mov rdi, r13
    mov rsi, qword ptr [r12 + 64]          # the area (its tables start zeroed)
    mov eax, 77                            # ftruncate
    syscall
    test rax, rax
    jnz ps_own_drop
    mov rdi, r13
    mov rsi, qword ptr [r12 + 72]
    add rsi, r12                           # then its head, from the program file
    mov rdx, qword ptr [r12 + 80]
    xor r10d, r10d
    mov eax, 18                            # pwrite64
    syscall
    cmp rax, qword ptr [r12 + 80]
    jne ps_own_drop
    mov r14, qword ptr [r12 + 64]
    jmp ps_map_maps
ps_own_again:
    lea rdi, [rbx + {PS_ENVBUF} + 4096]
    call own_maps_open
    test rax, rax
    js ps_unmap
    mov r13, rax
    call program_file_size
    mov r14, rax
    test rax, rax
    jle ps_close_unmap
    jmp ps_map_maps
ps_own_drop:
    lea rdi, [rbx + {PS_ENVBUF} + 4096]
    mov eax, 87                            # unlink
    syscall
    jmp ps_close_unmap
ps_unmap_maps:
    mov rdi, rax
    mov rsi, r14
    mov eax, 11                            # munmap
    syscall
ps_close_unmap:
    mov rdi, r13
    mov eax, 3                             # close
    syscall
ps_unmap:
    mov rsi, qword ptr [rsp + 144]
    test rsi, rsi
    jz ps_fail                             # (the built-in program)
    mov rdi, r12
    mov eax, 11                            # munmap
    syscall
    jmp ps_fail
ps_close:
    mov rdi, r13
    mov eax, 3                             # close
    syscall
ps_fail:
    xor eax, eax
ps_done:
    add rsp, 160
    pop r15
    pop r14
    pop r13
    pop r12
    pop r10
    ret

# rdi = a buffer, r12 = the program -> DIR "/maps." RUN "." UID "." PID there, NUL-terminated;
# rdi past the NUL. Clobbers rax, rcx, rdx, rsi, r11.
own_maps_name:
    lea rsi, [rbx + {PS_DIR}]
    call append_str
    lea rsi, [rip + own_maps_prefix]
    call append_str
    push qword ptr [r12 + 40]              # the run
    call append_decimal
    add rsp, 8
    mov eax, 102                           # getuid
    call append_dot_call
    mov eax, 39                            # getpid
    call append_dot_call
    mov byte ptr [rdi], 0
    inc rdi
    ret

# rdi = a path -> rax = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC): fd or -errno.
own_maps_open:
    mov esi, 0xa0002
    xor edx, edx
    mov eax, 2                             # open
    syscall
    ret

# open(DIR "/" TAG SUFFIX, flags), the path built in PS_ENVBUF (free once the
# environment is read). rsi = the suffix, edx = the flags. -> rax = fd or -errno.
program_open:
    push rdx
    push rsi
    lea rdi, [rbx + {PS_ENVBUF}]
    lea rsi, [rbx + {PS_DIR}]
    call append_str
    mov byte ptr [rdi], 0x2f
    inc rdi
    lea rsi, [rip + file_tag]
    call append_str
    pop rsi                                # the suffix
    call append_str
    mov byte ptr [rdi], 0
    pop rsi                                # the flags
    lea rdi, [rbx + {PS_ENVBUF}]
    xor edx, edx
    mov eax, 2                             # open
    syscall
    ret

# r13 = fd, the caller's [rsp] (here [rsp + 8]) = a 144-byte buffer for fstat ->
# rax = the file's size when it is a regular file of this user or root, else -1.
program_file_size:
    lea rsi, [rsp + 8]
    mov rdi, r13
    mov eax, 5                             # fstat
    syscall
    test rax, rax
    jnz pfs_no
    mov eax, dword ptr [rsp + 8 + 24]      # st_mode
    and eax, 0xf000
    cmp eax, 0x8000
    jne pfs_no
    mov eax, 102                           # getuid
    syscall
    mov ecx, dword ptr [rsp + 8 + 28]      # st_uid
    test ecx, ecx
    jz pfs_yes
    cmp ecx, eax
    jne pfs_no
pfs_yes:
    mov rax, qword ptr [rsp + 8 + 48]      # st_size
    ret
pfs_no:
    mov rax, -1
    ret

# rsi = descriptor (u8 kind, size, signed, base, index, scale, shift; i64 value),
# r12 = frame, r15 = site rsp, r8 = region -> rax. Clobbers rax, rcx, rdx.
argument_value:
    movzx ecx, byte ptr [rsi]
    cmp ecx, 3
    je av_constant
    cmp ecx, 1
    je av_register
    # memory: base + index * scale + displacement (kind 4: + load bias; 5: + the
    # thread pointer, x86's %fs segment)
    movzx ecx, byte ptr [rsi + 3]
    call frame_register
    mov rdx, rax
    movzx ecx, byte ptr [rsi + 4]
    call frame_register
    movzx ecx, byte ptr [rsi + 5]
    imul rax, rcx
    add rax, rdx
    add rax, qword ptr [rsi + 8]
    cmp byte ptr [rsi], 5
    je av_thread
    cmp byte ptr [rsi], 4
    jne av_load
    add rax, qword ptr [r8 + {OFF_LOAD_BIAS}]
    jmp av_load
av_thread:
    .byte 0x64, 0x48, 0x03, 0x04, 0x25, 0, 0, 0, 0   # add rax, fs:[0] (the TLS ABI: the thread pointer)
av_load:
    movzx ecx, byte ptr [rsi + 1]
    cmp ecx, 8
    je av_load8
    cmp ecx, 4
    je av_load4
    cmp ecx, 2
    je av_load2
    movzx eax, byte ptr [rax]
    jmp av_extend
av_load2:
    movzx eax, word ptr [rax]
    jmp av_extend
av_load4:
    mov eax, dword ptr [rax]
    jmp av_extend
av_load8:
    mov rax, qword ptr [rax]
    ret
av_constant:
    mov rax, qword ptr [rsi + 8]
    ret
av_register:
    movzx ecx, byte ptr [rsi + 3]
    call frame_register
    movzx ecx, byte ptr [rsi + 6]          # a shift: %ah ... are bits 8-15 of their register
    shr rax, cl
av_extend:
    movzx ecx, byte ptr [rsi + 1]
    cmp byte ptr [rsi + 2], 0
    je av_unsigned
    cmp ecx, 4
    je av_s4
    cmp ecx, 2
    je av_s2
    cmp ecx, 1
    jne av_done
    movsx rax, al
    ret
av_s2:
    movsx rax, ax
    ret
av_s4:
    movsxd rax, eax
    ret
av_unsigned:
    cmp ecx, 4
    je av_u4
    cmp ecx, 2
    je av_u2
    cmp ecx, 1
    jne av_done
    movzx eax, al
    ret
av_u2:
    movzx eax, ax
    ret
av_u4:
    mov eax, eax
av_done:
    ret

# ecx = frame slot -> rax: the site's register (15 = rsp, 16 = none: 0)
frame_register:
    xor eax, eax
    cmp ecx, 16
    je fr_done
    mov rax, r15
    cmp ecx, 15
    je fr_done
    mov rax, qword ptr [r12 + rcx*8]
fr_done:
    ret

# A function probed at entry and return was entered: remember when, and at which
# stack pointer (its frame), on this thread's stack of open calls.
# rsi = this thread's row, rdx = region, rcx = the site's rsp (+ 1: Go code where r14
# holds the goroutine, lat_enter_g). Preserves everything but rcx and flags.
# (Called only where the region's flags say latency was asked for.)
lat_enter:
    test cl, 1
    jnz lat_enter_g
    push rax
    push rdi
    push rdx
    push rsi
    mov edi, dword ptr [rdx + {OFF_PROBE_COUNT}]
    mov eax, dword ptr [rdx + {OFF_LATENCY_COUNT}]
    shl rax, {HISTOGRAM_SHIFT}
    lea rdi, [rdi*8 + rax]
    add rsi, rdi                           # the stack: depth, then {{rsp, ticks}} entries
    mov rdi, rcx                           # the site's rsp
le_drop:                                   # open calls at or below this frame have ended
    mov rcx, qword ptr [rsi]               # without returning (longjmp): forget them
    test rcx, rcx
    jz le_push
    shl rcx, 4
    cmp qword ptr [rsi + rcx], rdi         # the innermost entry's rsp (at 16 + 16 * (depth - 1))
    ja le_push
    dec qword ptr [rsi]
    jmp le_drop
le_push:
    mov rcx, qword ptr [rsi]
    cmp rcx, {LATENCY_DEPTH}
    jae le_done                            # full: this call goes unmeasured
    shl rcx, 4
    lea rcx, [rsi + rcx + 16]
    mov qword ptr [rcx], rdi
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov qword ptr [rcx + 8], rax
    inc qword ptr [rsi]
le_done:
    pop rsi
    pop rdx
    pop rdi
    pop rax
    ret

# The function returns: drop calls left without a return (their frames lie below
# ours: longjmp, exceptions), and if the innermost open call is ours, add how long
# it took to histogram [rsp + 8] (pushed by the caller; taken off by the return).
# rsi = row, rdx = region, rcx = the site's rsp (+ 1: Go code, lat_exit_g). Preserves
# all but rcx and flags.
lat_exit:
    test cl, 1
    jnz lat_exit_g
    push rax
    push rdi
    push rdx
    push rsi
    push r8
    push r9
    push r10
    mov r8d, dword ptr [rsp + 64]          # the histogram: past our 7 pushes and the return address
    mov r9, qword ptr [rdx + {OFF_NS_MULT}]
    mov r10d, dword ptr [rdx + {OFF_PROBE_COUNT}]
    shl r10, 3                             # the histograms follow the counters
    mov eax, dword ptr [rdx + {OFF_LATENCY_COUNT}]
    shl rax, {HISTOGRAM_SHIFT}
    add rax, r10
    mov rdx, rcx                           # the site's rsp
    lea rcx, [rsi + rax]                   # the stack
lx_pop:
    mov rax, qword ptr [rcx]
    test rax, rax
    jz lx_missed                           # no open call: our entry was not recorded
    dec rax
    shl rax, 4
    cmp qword ptr [rcx + rax + 16], rdx
    jae lx_ours
    shr rax, 4                             # below ours: never returned; forget it
    mov qword ptr [rcx], rax
    jmp lx_pop
lx_ours:
    jne lx_missed                          # above ours: our entry was not recorded
    mov rdi, qword ptr [rcx + rax + 24]    # ticks at entry
    shr rax, 4
    mov qword ptr [rcx], rax
    rdtsc
    shl rdx, 32
    or rax, rdx
    sub rax, rdi
    mul r9
    shrd rax, rdx, 32                      # nanoseconds
    xor edi, edi                           # bucket 0: under 1 ns; k: [2^(k-1), 2^k)
    test rax, rax
    jz lx_bucket
    bsr rdi, rax
    inc edi
    cmp edi, {LATENCY_BUCKETS_MAX}
    jbe lx_bucket
    mov edi, {LATENCY_BUCKETS_MAX}
lx_bucket:
    shl r8, {HISTOGRAM_SHIFT}
    add r8, r10
    lea r8, [r8 + rdi*8]
    add qword ptr [rsi + r8], 1            # the row is this thread's: a plain add
    jmp lx_done
lx_missed:                                 # (its stack was full, or it entered on another
    mov rax, qword ptr [rsp + 32]          # thread): the region says how many
    lock inc qword ptr [rax + {OFF_LATENCY_MISSED}]
lx_done:
    pop r10
    pop r9
    pop r8
    pop rsi
    pop rdx
    pop rdi
    pop rax
    ret 8

# Go code: a goroutine moves between threads mid-call and its stack is copied when
# it grows, so its open calls are kept in the region's table (docs/region.md), keyed
# by g (r14) and stack.hi - sp, which stays the same through both. Only the goroutine
# of g writes entries keyed by g, and it runs on one thread at a time; a free entry
# (0: never used, 1: used before) is claimed by compare-and-swap.
# rcx = the site's rsp + 1, rdx = region -> rax = 0 when the call cannot be keyed;
# else rdx = the table, rsi = offset of the key's first entry, r8 = stack.hi - sp.
go_call_key:
    xor eax, eax
    mov r8, qword ptr [rdx + {OFF_GO_CALLS}]
    test r8, r8
    jz gk_done
    add rdx, r8
    test r14, r14
    jz gk_done                             # no goroutine (needm; a signal on a C thread)
    lea r8, [rcx - 1]
    cmp r8, qword ptr [r14]
    jb gk_done                             # not on the goroutine's stack (a signal
    mov rsi, qword ptr [r14 + 8]           # handler's): no key that lasts
    cmp r8, rsi
    jae gk_done
    sub rsi, r8
    mov r8, rsi
    add rsi, r14
    movabs rax, {HASH_MULTIPLIER}
    imul rsi, rax
    shr rsi, {GO_CALL_SHIFT}
    shl rsi, {GO_CALL_SIZE_SHIFT}
gk_done:
    ret

# A Go function measured for latency was entered: its entry at its key, now. Entered
# again at the same key (its prologue runs again after morestack grew the stack),
# the call keeps the later time: one call, one pair. No free entry near its key:
# unmeasured, and its return counts as missed. rcx = the site's rsp + 1, rdx = region.
lat_enter_g:
    push rax
    push rdx
    push rsi
    push rdi
    push r8
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov rdi, rax                           # the time of entry
    mov rdx, qword ptr [rsp + 24]
    call go_call_key
    test rax, rax
    jz leg_done
    push rsi
leg_search:                                # the first entry that is ours (entered again)
    mov rsi, qword ptr [rsp]               # or free: one of ours past a free one is an
    mov ecx, {GO_CALL_PROBES}              # older call's; a return finds the newer first
leg_probe:
    mov rax, qword ptr [rdx + rsi]
    cmp rax, r14
    jne leg_other
    cmp qword ptr [rdx + rsi + 8], r8
    je leg_again
leg_other:
    cmp rax, 1
    jbe leg_claim                          # free: 0 never used, 1 used before
    add rsi, {GO_CALL_SIZE}
    and rsi, {GO_CALLS_MASK}
    dec ecx
    jnz leg_probe
    jmp leg_popped                         # full near the key
leg_claim:
    lock cmpxchg qword ptr [rdx + rsi], r14
    jne leg_search                         # taken since: look again
    mov qword ptr [rdx + rsi + 8], r8
    mov qword ptr [rdx + rsi + 16], rdi
    jmp leg_popped
leg_again:
    mov qword ptr [rdx + rsi + 16], rdi
leg_popped:
    pop rsi
leg_done:
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rax
    ret

# A Go function measured for latency returns: its entry at its key gives the sample,
# added atomically to histogram [rsp + 8] of row rsi (the thread's own, or the shared
# row: a goroutine's pair needs no row of its own); no entry: missed, counted.
# rcx = the site's rsp + 1, rdx = region.
lat_exit_g:
    push rax
    push rdx
    push rsi
    push rdi
    push r8
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov rdi, rax                           # now
    mov rdx, qword ptr [rsp + 24]
    call go_call_key
    test rax, rax
    jz lxg_missed
    mov ecx, {GO_CALL_PROBES}
lxg_probe:
    mov rax, qword ptr [rdx + rsi]
    cmp rax, r14
    jne lxg_other
    cmp qword ptr [rdx + rsi + 8], r8
    je lxg_found
lxg_other:
    test rax, rax
    jz lxg_missed                          # never used: no entry lies beyond it
    add rsi, {GO_CALL_SIZE}
    and rsi, {GO_CALLS_MASK}
    dec ecx
    jnz lxg_probe
    jmp lxg_missed
lxg_found:
    sub rdi, qword ptr [rdx + rsi + 16]    # ticks since entry
    mov qword ptr [rdx + rsi], 1           # free again
    mov rcx, qword ptr [rsp + 24]          # region
    mov rax, rdi
    mul qword ptr [rcx + {OFF_NS_MULT}]
    shrd rax, rdx, 32                      # nanoseconds
    xor edi, edi
    test rax, rax
    jz lxg_bucket
    bsr rdi, rax
    inc edi
    cmp edi, {LATENCY_BUCKETS_MAX}
    jbe lxg_bucket
    mov edi, {LATENCY_BUCKETS_MAX}
lxg_bucket:
    mov r8d, dword ptr [rsp + 48]          # the histogram: past 5 pushes and the return address
    shl r8, {HISTOGRAM_SHIFT}
    mov ecx, dword ptr [rcx + {OFF_PROBE_COUNT}]
    lea r8, [r8 + rcx*8]
    lea r8, [r8 + rdi*8]
    mov rsi, qword ptr [rsp + 16]          # the row
    lock add qword ptr [rsi + r8], 1
    jmp lxg_done
lxg_missed:
    mov rax, qword ptr [rsp + 24]
    lock inc qword ptr [rax + {OFF_LATENCY_MISSED}]
lxg_done:
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rax
    ret 8

# Set-up from a trampoline in Go code: lazy_init on a stack of its own in the state
# page, since it needs more than a goroutine's stack may hold below rsp (docs/design.md,
# "Go's stacks"). One set-up at a time uses that stack: a hit meanwhile (another
# thread's, or a signal handler's on this one) leaves the set-up to it, uncounted
# unless it finds the probes armed. Uses 16 bytes of the caller's stack.
lazy_init_aside:
    push rbx
    lea rbx, [rip + link_table]
    add rbx, qword ptr [rip + lt_state]
    lock bts qword ptr [rbx + {ASIDE_BUSY}], 0
    jc lia_busy
    mov qword ptr [rbx + {ASIDE_SP}], rsp
    lea rsp, [rbx + {ASIDE_TOP}]
    call lazy_init
    mov rsp, qword ptr [rbx + {ASIDE_SP}]
    mov qword ptr [rbx + {ASIDE_BUSY}], 0
lia_busy:
    pop rbx
    ret

# -- Return-address redirection (return probes of functions whose exits cannot be
# patched). Each thread keeps a shadow stack in private memory, which a forked child
# copies with the frames it still has to return from. A stack is u64 depth, u64
# reserved, then entries {{u64 rsp, u64 return address}}: rsp is the slot the return
# address was in, the key the return stub finds its entry by. The table of stacks,
# {{u64 thread pointer, u64 stack}}, lives in the state memory (not cleared by fork).

# -> rbx = this thread's shadow stack, or 0 (no thread pointer, the table is full,
# or the stack could not be mapped). edi = 1: a thread without one claims a table
# entry and maps its stack (the one system call, at its first redirected call).
# Clobbers rax, rcx, rsi, rdi, r8 - r11.
shadow_stack:
    call load_state
    lea r8, [rbx + {PS_SHADOW}]
    xor ebx, ebx
    call thread_identity
    test rcx, rcx
    jz ss_done
    movabs rax, {HASH_MULTIPLIER}
    imul rax, rcx
    shr rax, {SHADOW_SHIFT}                # the first entry to look at
    mov r9d, {SHADOW_THREADS}
ss_look:
    mov r10, rax
    shl r10, 4
    add r10, r8                            # r10 = the entry {{thread, stack}}
    cmp qword ptr [r10], rcx
    je ss_mine
    cmp qword ptr [r10], 0
    je ss_free
ss_next:
    inc eax
    and eax, {SHADOW_MASK}
    dec r9d
    jnz ss_look
ss_done:
    ret
ss_mine:
    mov rbx, qword ptr [r10 + 8]           # 0 while its owner maps it (a signal handler
    ret                                    # on that thread then does not redirect)
ss_free:
    test edi, edi                          # entries are never freed: a thread that had
    jz ss_done                             # one would have met it before a free one
    mov r11, rax
    xor eax, eax
    lock cmpxchg qword ptr [r10], rcx
    mov rax, r11
    jne ss_next                            # another thread took it meanwhile
    push rdx
    push r10
    xor edi, edi
    mov esi, {SHADOW_MAP_SIZE}
    mov edx, 3                             # PROT_READ | PROT_WRITE
    mov r10d, 0x4022                       # MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
    mov r8, -1
    xor r9d, r9d
    mov eax, 9                             # mmap
    syscall
    pop r10
    pop rdx
    cmp rax, -4096
    ja ss_done                             # no memory: this thread never redirects
    mov qword ptr [r10 + 8], rax
    mov rbx, rax
    ret

# rbx = a shadow stack, rdx = a return-address slot -> rax = the index of the
# topmost entry for that slot, or -1. Clobbers rcx.
shadow_find:
    mov rax, qword ptr [rbx]
sf_next:
    dec rax
    js sf_done
    mov rcx, rax
    shl rcx, 4
    cmp qword ptr [rbx + rcx + 16], rdx
    jne sf_next
sf_done:
    ret

# A function whose return address is redirected was entered (from its trampoline's
# armed path): rcx = the slot its return address is in, rsi = its return stub.
# Keeps the return address on this thread's shadow stack and puts the stub in its
# place. When the slot holds its own stub already (it was tail-called by itself,
# or by a function it tail-called), the entry keeps the stub: the stub then runs
# once per entry, a return counted for each call, as exit-site patching counts
# the tail-call jump and the final `ret`. Preserves every register but rax, rcx, rdx, rsi (the trampoline saved
# them) and flags (none at a function entry).
shadow_push:
{SAVE_PUSH}
    mov rdx, rcx
    mov r12, rsi
    mov edi, 1
    call shadow_stack
    test rbx, rbx
    jz sp_missed
    mov rax, qword ptr [rbx]
    cmp rax, {SHADOW_DEPTH}
    jae sp_missed
    lea rcx, [rax + 1]
    mov qword ptr [rbx], rcx               # take the entry first: a signal handler's
    shl rax, 4                             # calls meanwhile push above it
    mov rcx, qword ptr [rdx]
    mov qword ptr [rbx + rax + 16], rdx
    mov qword ptr [rbx + rax + 24], rcx
    mov qword ptr [rdx], r12               # it now returns to the stub
    jmp sp_done
sp_missed:                                 # not redirected: this return is not seen,
    call load_state                        # so the region says how many were missed
    mov rax, qword ptr [rbx]
    cmp rax, 1
    jbe sp_done
    lock inc qword ptr [rax + {OFF_RETURNS_MISSED}]
sp_done:
{RESTORE_PUSH}
    ret

# A redirected function returned into its stub, which calls us with rsp + 8 = the
# slot its return address was in. Puts the original return address back there and
# takes its entry off the shadow stack, with the entries above it (frames left by
# longjmp or an exception: they never return). Preserves every register but flags.
shadow_pop:
{SAVE_POP}
    lea rdx, [rsp + {SAVED_POP_BYTES} + 8]
    xor edi, edi
    call shadow_stack
    test rbx, rbx
    jz spop_elsewhere
    call shadow_find
    test rax, rax
    js spop_elsewhere
    shl rax, 4
    mov rcx, qword ptr [rbx + rax + 24]    # read before the entry is given back
    shr rax, 4
    mov qword ptr [rbx], rax
    mov qword ptr [rdx], rcx
{RESTORE_POP}
    ret
# Not on this thread's stack: its thread pointer changed since the call (a static
# program's start-up hands the stand-in TCB over to libc's). Look on every stack,
# and mark the entry taken (no slot address is odd) rather than move another
# thread's depth.
spop_elsewhere:
    call load_state
    lea r8, [rbx + {PS_SHADOW}]
    mov r9d, {SHADOW_THREADS}
spe_next:
    mov rbx, qword ptr [r8 + 8]
    test rbx, rbx
    jz spe_skip
    call shadow_find
    test rax, rax
    jns spe_found
spe_skip:
    add r8, 16
    dec r9d
    jnz spe_next
    # Nowhere (a stack that moved between threads, say): the return address is
    # lost. Stop with a message rather than run on.
    mov edi, 2
    lea rsi, [rip + lost_message]
    mov edx, {LOST_MESSAGE_SIZE}
    mov eax, 1                             # write
    syscall
    ud2
spe_found:
    shl rax, 4
    mov rcx, qword ptr [rbx + rax + 24]
    mov qword ptr [rbx + rax + 16], 1
    mov qword ptr [rdx], rcx
{RESTORE_POP}
    ret
lost_message:
    .ascii "{LOST_MESSAGE}"
    .byte 10

# this backend's own entry points, read back by runtime.py (the shared table follows)
x86_exports:
    .quad shadow_push
    .quad shadow_pop
