"""Code shared by two functions (glibc's string functions do this): when another
function branches into the middle of f and leaves by f's `ret`, patching f's exits
would count the other function's returns as f's. Such a return probe is refused."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import run

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")

# other_near reaches shared_b's tail with a short jump, other_far with a rel32 one
SOURCE = r"""
#include <stdio.h>
int other_near(int), other_far(int), shared_b(int), alone(int);
__asm__(
    ".text\n"
    ".globl other_far\n.type other_far,@function\nother_far:\n"
    "    mov $3, %eax\n    jmp.d32 tail\n.size other_far, .-other_far\n"
    ".skip 300, 0xcc\n"
    ".globl other_near\n.type other_near,@function\nother_near:\n"
    "    mov $1, %eax\n    jmp tail\n.size other_near, .-other_near\n"
    ".globl shared_b\n.type shared_b,@function\nshared_b:\n"
    "    mov $2, %eax\n    nop\n    nop\n    nop\n    nop\n    nop\n"
    "tail:\n    add %edi, %eax\n    ret\n.size shared_b, .-shared_b\n"
    ".skip 16, 0xcc\n"
    ".globl alone\n.type alone,@function\nalone:\n"
    "    mov $4, %eax\n    nop\n    nop\n    nop\n    nop\n    nop\n"
    "    add %edi, %eax\n    ret\n.size alone, .-alone\n");
int main(void) {
    printf("%d %d %d %d\n", other_near(10), other_far(10), shared_b(10), alone(10));
    return 0;
}
"""


def urewrite(*args):
    return run([sys.executable, "-m", "urewrite", *args])


def test_a_function_whose_tail_others_enter_takes_no_exit_patch(tmp_path):
    (tmp_path / "shared.c").write_text(SOURCE)
    binary = tmp_path / "shared"
    subprocess.run(["gcc", "-O2", "-no-pie", tmp_path / "shared.c", "-o", binary], check=True)
    listed = {f["name"]: f["return"] for f in
              json.loads(urewrite("list", "--json", binary).stdout)["functions"]}
    assert "other code branches into it" in listed["shared_b"]["reason"]
    assert listed["shared_b"]["mechanism"] is None  # (no FDE: no redirection either)
    assert listed["alone"]["mechanism"] == "exit sites"  # the control: same shape, alone
    assert listed["other_near"]["mechanism"] == listed["other_far"]["mechanism"] == "exit sites"

    out = urewrite(binary, "-r", "shared_b", "-o", tmp_path / "shared.probed")
    assert out.returncode == 1 and "other code branches into it" in out.stderr


def test_near_and_far_entries_are_both_seen(tmp_path):
    """Remove one of the two outside branches at a time: each alone is found."""
    for keep in ("near", "far"):
        source = SOURCE.replace(f"jmp{'' if keep == 'far' else '.d32'} tail", "ret")
        (tmp_path / f"{keep}.c").write_text(source)
        binary = tmp_path / keep
        subprocess.run(["gcc", "-O2", "-no-pie", tmp_path / f"{keep}.c", "-o", binary], check=True)
        listed = {f["name"]: f["return"] for f in
                  json.loads(urewrite("list", "--json", binary).stdout)["functions"]}
        assert "other code branches into it" in (listed["shared_b"]["reason"] or ""), keep
