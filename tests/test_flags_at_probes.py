"""The status flags at a probe point inside a function (x86_64, arch/x86_64/flags.py).

A trampoline keeps the flags where the code after the point may read them, and takes
its lighter forms where the window's instructions change them all first. Unit checks of
the rule on instruction sequences, then a program whose USDT sites sit between a flag's
setting and its reading (cmp then adc; inc then jc; a shift by cl, maybe 0, then
setnz; a jump to an adc) and where they are dead (cmp or and after the site, or after a
jump): rewritten, it prints what the original prints, disarmed and counting, with every
hit counted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import run
from urewrite.arch.x86_64 import flags

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def _live(text: str, point: int = 0) -> bool:
    """flags.live_at over `text` (Intel syntax) assembled at 0x1000, nothing around
    it; the point is the start of instruction number `point`."""
    from keystone import KS_ARCH_X86, KS_MODE_64, Ks
    from iced_x86 import Decoder
    from urewrite.errors import UrewriteError
    code = bytes(Ks(KS_ARCH_X86, KS_MODE_64).asm(text, 0x1000)[0])
    starts = [insn.ip for insn in Decoder(64, code, ip=0x1000)]

    def read(address: int, size: int) -> bytes:
        if not (0x1000 <= address and address + size <= 0x1000 + len(code)):
            raise UrewriteError(f"address {address:#x} is not in the file")
        return code[address - 0x1000:address - 0x1000 + size]
    return flags.live_at(read, starts[point])


@pytest.mark.parametrize("text, point, live", [
    ("nop; cmp rax, rdi", 0, False),
    ("nop; and eax, 1", 0, False),  # (AF undefined: no program reads it)
    ("nop; mov rax, rbx; test rax, rax", 0, False),
    ("nop; shl rax, 3", 0, False),
    ("nop; call 0x2000", 0, False),  # (the SysV ABI keeps no flag across a call)
    ("nop; ret", 0, False),
    ("nop; call 0x1006; pop rax; jne 0x2000", 0, True),  # (a push of its own address)
    ("cmp rax, rdi; nop; xor eax, eax", 1, False),
    ("nop; jmp 0x1010; ud2; ud2; ud2; ud2; ud2; ud2; nop; test eax, eax", 0, False),
    ("nop; jmp 0x1010; ud2; ud2; ud2; ud2; ud2; ud2; nop; adc eax, 0", 0, True),
    ("nop; jne 0x2000", 0, True),
    ("nop; jmp rax", 0, True),
    ("nop; adc rax, 0", 0, True),
    ("nop; inc rax", 0, True),  # (CF as it was, and nothing more to read)
    ("nop; inc rax; add rax, 1", 0, False),
    ("nop; shl rax, cl", 0, True),  # (a count of 0 changes nothing)
    ("nop; shl rax, cl; test rax, rax", 0, False),
    ("nop; rep cmpsb byte ptr [rsi], byte ptr [rdi]", 0, True),
    ("nop; syscall", 0, True),  # (it reads them: the kernel gives them back)
    ("nop; ud2", 0, True),
    ("cmp rax, rdi; nop; setne al", 1, True),
    ("nop; pushfq", 0, True),
    ("nop; lahf; cmp rax, 1", 0, True),
    ("l: nop; jmp l", 0, True),  # (a loop that changes nothing: the walk gives up)
])
def test_the_rule(text, point, live):
    assert _live(text, point) == live


SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

/* CF from the cmp, read by the adc after the probe */
__attribute__((noipa)) long carry(long a, long b) {
    long r = 0;
    __asm__ volatile("cmp %2, %1\n"
                     STAP_PROBE_ASM(flags, carry, ".ascii \"8@%1\"\n", "")
                     "adc $0, %0\n" : "+r"(r) : "r"(a), "r"(b) : "cc");
    return r;
}

/* inc keeps CF: the jc after it reads the cmp's, across the probe */
__attribute__((noipa)) long kept(long a, long b) {
    long r = 0;
    __asm__ volatile("cmp %2, %1\n"
                     STAP_PROBE_ASM(flags, kept, ".ascii \"8@%1\"\n", "")
                     "inc %0\n"
                     "jc 1f\n"
                     "add $10, %0\n"
                     "1:\n" : "+r"(r) : "r"(a), "r"(b) : "cc");
    return r;
}

/* a shift by cl that may be by 0 (flags then as the test left them) */
__attribute__((noipa)) long shifted(long a, long n) {
    long r = a;
    unsigned char z;
    __asm__ volatile("test %0, %0\n"
                     STAP_PROBE_ASM(flags, shifted, ".ascii \"8@%0\"\n", "")
                     "shl %%cl, %0\n"
                     "setnz %1\n" : "+r"(r), "=q"(z) : "c"(n) : "cc");
    return r * 2 + z;
}

/* dead after the probe: the cmp, the and, the test set them all */
__attribute__((noipa)) long dead(long a, long b) {
    long r = a;
    unsigned char lt;
    __asm__ volatile(STAP_PROBE_ASM(flags, dead_cmp, ".ascii \"8@%0\"\n", "")
                     "cmp %2, %0\n"
                     "setb %1\n" : "+r"(r), "=q"(lt) : "r"(b) : "cc");
    __asm__ volatile(STAP_PROBE_ASM(flags, dead_and, ".ascii \"8@%0\"\n", "")
                     "and $7, %0\n" : "+r"(r) : : "cc");
    return r + lt;
}

/* a site then a jump to where the flags are set (dead), or read (live): the walk
   follows the jump, as at PostgreSQL's out-of-line probe blocks */
__attribute__((noipa)) long hops(long a, long b) {
    long r = a, c = 0;
    unsigned char lt;
    __asm__ volatile("jmp 2f\n"
                     "1:\n"
                     STAP_PROBE_ASM(flags, hop_dead, ".ascii \"8@%0\"\n", "")
                     "jmp 3f\n"
                     "2:\n"
                     "jmp 1b\n"
                     "3:\n"
                     "cmp %2, %0\n"
                     "setb %1\n" : "+r"(r), "=q"(lt) : "r"(b) : "cc");
    __asm__ volatile("cmp %2, %1\n"
                     "jmp 2f\n"
                     "1:\n"
                     STAP_PROBE_ASM(flags, hop_live, ".ascii \"8@%1\"\n", "")
                     "jmp 3f\n"
                     "2:\n"
                     "jmp 1b\n"
                     "3:\n"
                     "adc $0, %0\n" : "+r"(c) : "r"(a), "r"(b) : "cc");
    return r + lt + 3 * c;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < n; i++) {
        long a = (i * 7919) % 101, b = (i * 104729) % 97;
        sum = sum * 31 + carry(a, b);
        sum = sum * 31 + kept(a, b);
        sum = sum * 31 + shifted(a - 50, i % 3);
        sum = sum * 31 + dead(a, b);
        sum = sum * 31 + hops(a, b);
    }
    printf("%ld\n", sum);
    return 0;
}
"""
SITES = {"carry": True, "kept": True, "shifted": True, "dead_cmp": False, "dead_and": False,
         "hop_dead": False, "hop_live": True}


def urewrite(*args):
    return run([sys.executable, "-m", "urewrite", *map(str, args)], timeout=300)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_sites_between_a_flags_setting_and_its_reading(tmp_path, opt):
    if not any(os.path.exists(f"/usr/include/{d}sys/sdt.h") for d in ("", "x86_64-linux-gnu/")):
        pytest.skip("sys/sdt.h is not installed (systemtap-sdt-dev)")
    source, plain, probed = tmp_path / "f.c", tmp_path / "f", tmp_path / "f.probed"
    source.write_text(SOURCE)
    subprocess.run(["gcc", opt, str(source), "-o", str(plain)], check=True)
    done = urewrite(plain, "-p", "usdt:flags:*", "-o", probed, "-q")
    assert done.returncode == 0, done.stderr
    assert _kept(probed) == SITES  # (so each form below is the one tested)
    calls = 3000
    expected = subprocess.run([str(plain), str(calls)], capture_output=True, text=True)
    disarmed = subprocess.run([str(probed), str(calls)], capture_output=True, text=True)
    assert disarmed.stdout == expected.stdout and expected.stdout.strip()
    counted = urewrite("stat", "--json", "--", probed, calls)
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.splitlines()[0] == expected.stdout.strip()
    hits = {p["name"].split(":")[-1]: p["hits"]
            for p in json.loads(counted.stdout.split("\n", 1)[1])["probes"]}
    assert hits == {name: calls for name in SITES}


def _kept(probed) -> dict:
    """Whether each USDT site's trampoline keeps the flags: its check, where the site
    jumps (by a hop where it is tight), is `lea rsp, [rsp - 128]; push rcx` (flags live) or `cmp qword ptr [rip +
    state], 1` (dead)."""
    import lief
    elf = lief.parse(str(probed))
    out = {}
    note = bytes(elf.get_section(".note.stapsdt").content)
    at = 0
    while at < len(note):
        namesz, descsz = (int.from_bytes(note[at + k:at + k + 4], "little") for k in (0, 4))
        desc = note[at + 12 + (namesz + 3 & ~3):][:descsz]
        pc, name = int.from_bytes(desc[:8], "little"), desc[24:].split(b"\0")[1].decode()
        target = pc
        for _ in range(3):  # (a short jump to a hop, then the hop's jump: a tight site)
            jump = bytes(elf.get_content_from_virtual_address(target, 5))
            if jump[0] == 0xEB:
                target += 2 + int.from_bytes(jump[1:2], "little", signed=True)
            elif jump[0] == 0xE9:
                target += 5 + int.from_bytes(jump[1:], "little", signed=True)
                break
        check = bytes(elf.get_content_from_virtual_address(target, 5))
        out[name] = check == bytes.fromhex("488d642480")
        assert out[name] or check[:3] == bytes.fromhex("48833d"), (name, check.hex())
        at += 12 + (namesz + 3 & ~3) + (descsz + 3 & ~3)
    return out
