"""The cache of assembled runtimes: hits, misses, damaged entries, concurrent writers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from urewrite.arch import runtime_cache

C_SOURCE = "__attribute__((noinline)) int work(int x) { return x * 3 + (x > 7 ? x / 5 : 1); }\n" \
           "int main(int argc, char **argv) { return work(argc) == 3 ? 0 : 1; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(runtime_cache.CACHE_ENV_VAR, str(folder))
    return folder / "runtime"


class Assembler:
    def __init__(self, code: bytes = b"\x90" * 100):
        self.code, self.calls = code, 0

    def __call__(self) -> bytes:
        self.calls += 1
        return self.code


def _get(text="nop", assemble=None, base=0x1000):
    return runtime_cache.assembled(text, base, "KS_ARCH_X86", "KS_MODE_64", assemble or Assembler())


def test_a_second_call_reads_the_cache(cache):
    first = Assembler()
    assert _get(assemble=first) == first.code and first.calls == 1
    second = Assembler(b"different")
    assert _get(assemble=second) == first.code and second.calls == 0
    assert len(list(cache.glob("*.bin"))) == 1


def test_the_key_covers_text_base_and_architecture(cache):
    _get("nop")
    for args in (("ret", 0x1000, "KS_ARCH_X86"), ("nop", 0x2000, "KS_ARCH_X86"),
                 ("nop", 0x1000, "KS_ARCH_ARM64")):
        a = Assembler(b"other")
        assert runtime_cache.assembled(args[0], args[1], args[2], "KS_MODE_64", a) == b"other"
        assert a.calls == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_a_miss_and_is_repaired(cache, damage):
    _get()
    (entry,) = cache.glob("*.bin")
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[:-7], "flip": data[:-1] + bytes([data[-1] ^ 1]),
                       "empty": b"", "garbage": os.urandom(len(data))}[damage])
    again = Assembler()
    assert _get(assemble=again) == again.code and again.calls == 1
    assert _get(assemble=Assembler(b"unused")) == again.code  # rewritten whole


def test_an_empty_setting_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime_cache.CACHE_ENV_VAR, "")
    monkeypatch.chdir(tmp_path)
    a = Assembler()
    _get(assemble=a)
    _get(assemble=a)
    assert a.calls == 2 and not list(tmp_path.iterdir())


def test_an_unusable_folder_only_costs_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(runtime_cache.CACHE_ENV_VAR, str(blocker))
    a = Assembler()
    assert _get(assemble=a) == a.code and _get(assemble=a) == a.code and a.calls == 2


def test_old_entries_are_pruned(cache, monkeypatch):
    monkeypatch.setattr(runtime_cache, "KEEP", 3)
    for i in range(6):
        _get(f"nop {i}")
        for entry in cache.glob("*.bin"):  # distinct, increasing times without sleeping
            st = entry.stat()
            os.utime(entry, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert len(list(cache.glob("*.bin"))) == 3
    assert not list(cache.glob(".tmp-*"))


def test_concurrent_writers_each_publish_a_whole_entry(cache):
    code = os.urandom(200_000)  # large enough for writes to interleave
    results, errors = [], []

    def worker():
        try:
            for _ in range(20):
                results.append(_get(assemble=Assembler(code)))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80 and all(r == code for r in results)
    assert len(list(cache.glob("*.bin"))) == 1 and not list(cache.glob(".tmp-*"))


def test_a_cached_rewrite_gives_the_same_file_without_keystone(tmp_path):
    source = tmp_path / "prog.c"
    source.write_text(C_SOURCE)
    binary = tmp_path / "prog"
    subprocess.run(["gcc", "-O2", str(source), "-o", str(binary)], check=True)
    code = ("import sys\nfrom urewrite.commands import main\n"
            "try:\n    main(sys.argv[1:], prog_name='urewrite')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(' '.join(m for m in ('lief', 'keystone') if m in sys.modules))\n")
    outputs = []
    for cache_dir in ("", str(tmp_path / "cache"), str(tmp_path / "cache")):
        out = tmp_path / f"run{len(outputs)}" / "prog.probed"  # one name: one file tag
        out.parent.mkdir()
        env = dict(os.environ, UREWRITE_CACHE_DIR=cache_dir)
        proc = subprocess.run([sys.executable, "-c", code, str(binary), "-p", "work", "-q",
                               "-o", str(out)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        outputs.append((out.read_bytes(), proc.stdout.split()))
    (plain, loaded_off), (first, loaded_miss), (second, loaded_hit) = outputs
    assert plain == first == second
    assert loaded_off == loaded_miss == ["keystone"] and loaded_hit == []
