"""The runtime is kept only when two fresh Keystone runs give the same bytes."""

import keystone
import pytest

from urewrite.arch import runtime_asm
from urewrite.errors import UrewriteError

TEXT = "nop\nret\n"


class FlakyKs:
    """Fails, or gives other bytes, on the calls named in `script`."""
    script: list = []

    def __init__(self, arch, mode):
        pass

    def asm(self, text, base):
        outcome = self.script.pop(0)
        if outcome == "fail":
            raise keystone.KsError(keystone.KS_ERR_ASM_DIRECTIVE_VALUE_RANGE)
        return (list(outcome), 2)


@pytest.mark.parametrize("script", [
    [b"\x90\xc3", b"\x90\xc3"],
    ["fail", b"\x90\xc3", b"\x90\xc3"],
    [b"\x90\xc3", "fail", b"\x90\xc3"],
    [b"\x00\x00", b"\x90\xc3", b"\x90\xc3"],
])
def test_two_runs_that_agree_are_kept(monkeypatch, script):
    monkeypatch.setattr(FlakyKs, "script", list(script))
    monkeypatch.setattr(keystone, "Ks", FlakyKs)
    assert runtime_asm.assemble_twice(TEXT, 0, "KS_ARCH_X86", "KS_MODE_64", "t.s") == b"\x90\xc3"


@pytest.mark.parametrize("script", [
    ["fail"] * runtime_asm.ATTEMPTS,
    [bytes([k, 0xc3]) for k in range(runtime_asm.ATTEMPTS)],
])
def test_no_agreement_is_an_error_not_a_guess(monkeypatch, script):
    monkeypatch.setattr(FlakyKs, "script", list(script))
    monkeypatch.setattr(keystone, "Ks", FlakyKs)
    with pytest.raises(UrewriteError, match="cannot assemble the runtime"):
        runtime_asm.assemble_twice(TEXT, 0, "KS_ARCH_X86", "KS_MODE_64", "t.s")


def test_comments_are_cut_before_keystone_sees_them():
    x86 = 'lt: .quad 0   # a comment\n    .ascii "a#b"  # "quoted" too\n# whole line\n'
    assert runtime_asm.without_comments(x86, "#") == 'lt: .quad 0\n    .ascii "a#b"\n\n'
    arm = '    mov x0, #1   // one\n    .ascii "//x"\n'
    assert runtime_asm.without_comments(arm, "//") == '    mov x0, #1\n    .ascii "//x"\n'


@pytest.mark.parametrize("package, arch", [("urewrite.arch.x86_64", "KS_ARCH_X86"),
                                           ("urewrite.arch.aarch64", "KS_ARCH_ARM64")])
def test_no_comment_reaches_keystone(package, arch):
    from importlib import resources
    source = resources.files(package).joinpath("runtime.s").read_text()
    cut = runtime_asm.without_comments(source, runtime_asm.COMMENT[arch])
    marker = runtime_asm.COMMENT[arch]
    assert all(marker not in line.split('"')[0] for line in cut.splitlines())
    assert cut.count("\n") == source.count("\n")  # line numbers stay those of the file
