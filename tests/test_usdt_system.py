"""Every USDT site of the files on this machine that have them: OpenJDK 17's libjvm
(531 sites), PostgreSQL 15's postgres (71), python3.11, libstdc++, and the arm64
cross libraries under /usr/aarch64-linux-gnu (none has a site today: their count
is checked all the same). A file that is absent is skipped with the reason
(.ci/run installs postgresql-15 and openjdk-17-jre-headless).

For each file, against `readelf -n`:
- urewrite finds the same sites (provider, name, address, semaphore, arguments),
  in the same order, and `list` shows as many (libstdc++: the others' full `list`
  takes from 7 s to a minute; their every site is rewritten below);
- `-p 'usdt:*:*' --keep-going` probes every site or refuses it with a one-line
  reason, never a traceback: probes and refusals together are readelf's sites;
- each probed site's arguments are as readelf describes them: per argument its
  size, sign and operand, decoded here on the side (registers, memory with base,
  index, scale and displacement, constants, RIP-relative symbols with offsets
  such as postgres's `40+CheckpointStats(%rip)`, the symbols' addresses from
  `readelf -s`), and the descriptors urewrite made must say the same.
And the rewritten files run as the originals: python3.11 runs a script with the same
output, and `trace` reports its gc probes' arguments as the script's gc.collect()
calls passed and returned them (a stack slot and a register); `java -version` with the
rewritten libjvm (in a copy of the JDK tree) prints what the original does, and every
hotspot:thread__start event carries its thread's id; postgres prints the same
--version and --describe-config, and a --single run against a throwaway initdb (as
the postgres user) gives the original's query results.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import check, run, urewrite
from urewrite.arch.x86_64.arguments import REGISTERS as X86_REGISTERS
from urewrite.rewriter import usdt
from urewrite.rewriter.elf_file import ElfFile
from urewrite.trampolines.arguments import CONSTANT, LINKED_MEMORY, MEMORY, REGISTER

JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64")
LIBJVM = JDK / "lib/server/libjvm.so"
POSTGRES = Path("/usr/lib/postgresql/15/bin/postgres")
PYTHON = Path("/usr/bin/python3.11")
LIBSTDCXX = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
ARM64_LIBS = Path("/usr/aarch64-linux-gnu/lib")
# name -> (path, sites readelf counted when this test was written: a reminder, not checked)
FILES = {"libjvm": (LIBJVM, 531), "postgres": (POSTGRES, 71), "python3.11": (PYTHON, 8),
         "libstdc++": (LIBSTDCXX, 3)}
LISTED = ("libstdc++",)  # whose full `list` is quick enough here (postgres's: 7-19 s)

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf")


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not installed (Debian: .ci/run installs postgresql-15 and "
                    f"openjdk-17-jre-headless)")
    return path


def readelf_sites(path) -> List[dict]:
    """The stapsdt notes as readelf -n prints them."""
    text = check(["readelf", "-nW", path]).stdout
    sites = []
    for m in re.finditer(r"Provider: (\S+)\n\s+Name: (\S+)\n\s+Location: (0x[0-9a-f]+), "
                         r"Base: (0x[0-9a-f]+), Semaphore: (0x[0-9a-f]+)\n\s+Arguments:(.*)", text):
        sites.append({"provider": m.group(1), "name": m.group(2), "pc": int(m.group(3), 16),
                      "semaphore": int(m.group(5), 16), "arguments": m.group(6).strip()})
    assert len(sites) == text.count("NT_STAPSDT"), "a note this test could not read"
    return sites


def readelf_symbols(path) -> Dict[str, set]:
    """name -> the values of its defined symbols (readelf -s: .symtab and .dynsym)."""
    out: Dict[str, set] = {}
    for line in check(["readelf", "-sW", path]).stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0][:-1].isdigit() and f[0].endswith(":") and f[6] != "UND":
            out.setdefault(f[7].split("@")[0], set()).add(int(f[1], 16))
    return out


# -- an operand decoder of the test's own, for the forms these files hold ------------------------

_MEM = re.compile(r"^(?P<disp>[^()]*)\((?P<base>%\w+)?(?:,(?P<index>%\w+)(?:,(?P<scale>\d))?)?\)$")


def expected_spec(token: str, symbols: Dict[str, set]) -> Optional[dict]:
    """What one argument must decode to, or None for a form this decoder does not know."""
    m = re.fullmatch(r"(-?)(\d+)@(.+)", token)
    if not m:
        return None
    signed, size, operand = m.group(1) == "-", int(m.group(2)), m.group(3)
    if operand.startswith("$") and re.fullmatch(r"-?\d+", operand[1:]):
        value = int(operand[1:]) & ((1 << 8 * size) - 1)
        if signed and value >> (8 * size - 1):
            value -= 1 << 8 * size
        value = value - (1 << 64) if value >= 1 << 63 else value
        return {"kind": CONSTANT, "size": size, "signed": signed, "value": value}
    if operand.startswith("%") and operand[1:] in X86_REGISTERS:
        slot, width, shift = X86_REGISTERS[operand[1:]]
        return {"kind": REGISTER, "size": min(size, width), "signed": signed, "base": slot,
                "shift": shift}
    mem = _MEM.match(operand)
    if not mem:
        return None
    disp, base = mem.group("disp"), mem.group("base")
    if base == "%rip":
        sym = re.fullmatch(r"(?:(\d+)\+)?([A-Za-z_][\w.]*)(?:([-+]\d+))?", disp)
        if not sym or len(symbols.get(sym.group(2), ())) != 1:
            return None
        value = next(iter(symbols[sym.group(2)])) + int(sym.group(1) or 0) + int(sym.group(3) or 0)
        return {"kind": LINKED_MEMORY, "size": size, "signed": signed, "value": value}
    if not re.fullmatch(r"-?\d*", disp):
        return None

    def slot(name):
        return X86_REGISTERS[name[1:]][0] if name else 16
    return {"kind": MEMORY, "size": size, "signed": signed, "base": slot(base),
            "index": slot(mem.group("index")), "scale": int(mem.group("scale") or 1),
            "value": int(disp or 0)}


# -- per file -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """name -> (the rewrite's --json report, stderr, output path), made when first asked."""
    root = tmp_path_factory.mktemp("usdt_system")
    done = {}

    def get(name: str):
        if name not in done:
            path = _need(FILES[name][0])
            out = root / f"{name}.probed"
            proc = urewrite(path, "-p", "usdt:*:*", "--keep-going", "--json", "-o", out)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
            done[name] = (json.loads(proc.stdout), proc.stderr, out)
        return done[name]
    return get


@pytest.mark.parametrize("name", list(FILES))
def test_sites_are_readelfs(name):
    path = _need(FILES[name][0])
    expected = readelf_sites(path)
    found = usdt.discover(ElfFile.open(str(path)))
    assert [{"provider": u.provider, "name": u.name, "pc": u.pc, "semaphore": u.semaphore,
             "arguments": u.arguments} for u in found] == expected
    assert all(u.problem is None for u in found)


@pytest.mark.parametrize("name", LISTED)
def test_list_counts_every_site(name):
    path = _need(FILES[name][0])
    out = urewrite("list", "--json", path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    rows = json.loads(out.stdout)["usdt"]
    assert sorted((r["provider"], r["name"], r["address"], r["arguments"]) for r in rows) == \
        sorted((s["provider"], s["name"], s["pc"], s["arguments"]) for s in readelf_sites(path))
    assert all(r["patchable"] or (r["reason"] and "\n" not in r["reason"]) for r in rows)


@pytest.mark.parametrize("name", list(FILES))
def test_every_site_probes_with_readelfs_arguments_or_is_refused(name, rewritten):
    path = FILES[name][0]
    report, stderr, _ = rewritten(name)
    sites = readelf_sites(path)
    probed = [(p["name"], p["address"]) for p in report["probes"]]
    refused = {(r["name"], r["address"]): r["reason"] for r in report["refused"]}
    # a refused probe is one line, at its first unreadable site; its other sites go too
    refused_probes = {n for n, _ in refused}
    assert sorted(probed) == sorted((f"{s['provider']}:{s['name']}", s["pc"]) for s in sites
                                    if f"{s['provider']}:{s['name']}" not in refused_probes)
    assert all(reason and "\n" not in reason for reason in refused.values())
    warned = [line for line in stderr.splitlines() if line.startswith("urewrite: warning: ")]
    assert len(warned) == len(refused)
    # each probed site's arguments, as readelf says and as this test decodes them
    elf = ElfFile.open(str(path))
    symbols = usdt.Symbols(elf)
    from urewrite.arch import backend_for
    backend = backend_for(elf.machine)
    known = readelf_symbols(path)
    unknown_forms = set()
    for s in sites:
        if f"{s['provider']}:{s['name']}" in refused_probes:
            continue
        specs = backend.sdt_arguments(s["arguments"], symbols)
        tokens = s["arguments"].split()
        assert len(specs) == len(tokens)
        for token, spec in zip(tokens, specs):
            want = expected_spec(token, known)
            if want is None:
                unknown_forms.add(token)
                continue
            assert {k: getattr(spec, k) for k in want} == want, (s["name"], token, spec)
    assert not unknown_forms or backend.name != "x86_64", unknown_forms


def test_arm64_cross_libraries_list_every_site():
    """Debian builds them without sdt.h today: none has a site, and urewrite finds none;
    a site there would be rewritten like the others."""
    if not ARM64_LIBS.is_dir():
        pytest.skip(f"{ARM64_LIBS} is absent (Debian: libc6-dev-arm64-cross)")
    counted = 0
    for lib in sorted(ARM64_LIBS.glob("*.so*")):
        if lib.is_symlink() or not lib.read_bytes()[:4] == b"\x7fELF":
            continue
        sites = readelf_sites(lib)
        assert len(usdt.discover(ElfFile.open(str(lib)))) == len(sites), lib
        counted += 1
        if sites:
            out = urewrite(lib, "-p", "usdt:*:*", "--keep-going", "--json", "-o",
                           Path(tempfile.mkdtemp()) / lib.name)
            assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert counted > 5


# -- the rewritten files run as the originals ------------------------------------------------------

GC_SCRIPT = r"""
import gc
gc.disable()          # no collection but the script's own
def cycles(n):
    for _ in range(n):
        a = []
        a.append(a)
found = []
for generation, n in ((2, 5), (1, 7), (0, 3)):
    cycles(n)
    found.append((generation, gc.collect(generation)))
print(" ".join(f"{g}:{n}" for g, n in found))
"""


def test_python_runs_the_same_and_reports_its_gc_arguments(rewritten, tmp_path):
    _, _, probed = rewritten("python3.11")
    script = tmp_path / "gc_script.py"
    script.write_text(GC_SCRIPT)
    original = check([PYTHON, "-S", script]).stdout
    assert check([probed, "-S", script]).stdout == original
    events = tmp_path / "events.jsonl"
    out = urewrite("trace", "--json", "-o", events, "--", probed, "-S", script)
    assert out.returncode == 0 and out.stdout == original, out.stderr
    gc_events = [(e["probe"], e["args"]) for e in map(json.loads, events.read_text().splitlines())
                 if e["probe"] in ("python:gc__start", "python:gc__done")]
    expected = []
    for pair in original.split():
        generation, collected = map(int, pair.split(":"))
        expected += [("python:gc__start", [generation]), ("python:gc__done", [collected])]
    # (start-up's collections before them, the ones at exit after)
    assert any(gc_events[k:k + 6] == expected for k in range(len(gc_events))), gc_events
    assert collected > 0


def _jdk_copy(root: Path, libjvm: Path) -> Path:
    """A copy of the JDK tree (links, but the launcher and libjvm) with `libjvm`."""
    copy = root / "jdk"
    (copy / "bin").mkdir(parents=True)
    (copy / "lib" / "server").mkdir(parents=True)
    for entry in JDK.iterdir():
        if entry.name not in ("bin", "lib"):
            (copy / entry.name).symlink_to(entry)
    shutil.copy(JDK / "bin" / "java", copy / "bin" / "java")
    for entry in (JDK / "lib").iterdir():
        if entry.name != "server":
            (copy / "lib" / entry.name).symlink_to(entry)
    for entry in (JDK / "lib" / "server").iterdir():
        if entry.name != "libjvm.so":
            (copy / "lib" / "server" / entry.name).symlink_to(entry)
    shutil.copy(libjvm, copy / "lib" / "server" / "libjvm.so")
    return copy / "bin" / "java"


def test_java_runs_with_the_rewritten_libjvm(rewritten, tmp_path):
    _, _, probed = rewritten("libjvm")
    java = _jdk_copy(tmp_path, probed)
    original = check([JDK / "bin" / "java", "-version"])
    again = check([java, "-version"])
    assert (again.stdout, again.stderr) == (original.stdout, original.stderr)
    events = tmp_path / "events.jsonl"
    out = urewrite("trace", "--json", "-o", events, "--", java, "-version")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert original.stderr in out.stderr
    starts = [e for e in map(json.loads, events.read_text().splitlines())
              if e["probe"] == "hotspot:thread__start"]
    # (name, name length, java thread id, native thread id, daemon)
    assert len(starts) >= 3
    assert all(e["args"][3] == e["tid"] and e["args"][4] in (0, 1) and 0 < e["args"][1] < 64
               for e in starts), starts
    assert len({e["args"][2] for e in starts}) == len(starts)


def _postgres_user():
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


def test_postgres_runs_the_same(rewritten):
    _, _, probed = rewritten("postgres")
    user = _postgres_user()
    if os.geteuid() != 0 or user is None or shutil.which("runuser") is None:
        pytest.skip("needs root, runuser and the postgres user (postgres will not run as root)")
    work = Path(tempfile.mkdtemp(prefix="urewrite-pg-"))  # (pytest's are root's alone)
    try:
        os.chmod(work, 0o755)
        binary = work / "postgres"
        shutil.copy(probed, binary)
        os.chmod(binary, 0o755)
        data = work / "data"
        data.mkdir()
        os.chown(data, user.pw_uid, user.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
        for args in (["--version"], ["--describe-config"]):
            assert check([*as_postgres, binary, *args]).stdout == \
                check([*as_postgres, POSTGRES, *args]).stdout
        check([*as_postgres, POSTGRES.parent / "initdb", "-D", data, "-A", "trust"])
        sql = "create table t(a int);\ninsert into t select generate_series(1, 100);\n" \
              "select sum(a), count(*) from t;\ndrop table t;\n"
        results = []
        for server in (POSTGRES, binary):
            proc = subprocess.run([*as_postgres, str(server), "--single", "-D", str(data),
                                   "postgres"], input=sql, capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 0, proc.stderr
            results.append(re.findall(r"\d+: \w+ = \"[^\"]*\"", proc.stdout))
        assert results[0] == results[1] and 'sum = "5050"' in " ".join(results[1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
