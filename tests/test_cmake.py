"""The CMake integration: samples/cmake built with cmake + ninja (and make) in a temporary folder.

urewrite_instrument() must rewrite after link (a program and a shared library), give files that
behave like the originals and count exactly under `urewrite stat`, re-run the rewrite when the
input or the probe list changes and not otherwise, and fail the build with urewrite's message
when a probe cannot be placed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from build_systems import check, run, stat, urewrite

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "cmake"
N = 10  # requests; see samples/cmake/server.c for the counts
# beyond entry probes: a return probe and a USDT probe (samples/cmake/server.c)
OTHER_COUNTS = {"parse_header (return)": N, "server:request": N}
SERVER_COUNTS = {"handle_request": N, "parse_header": N, "parse_body": N // 2,
                 "parse_trailer": (N + 2) // 3, **OTHER_COUNTS}
DEMO_COUNTS = {"demo_add": N, "demo_mul": 2 * N}
PROBES_LINE = 'urewrite_instrument(server PROBES handle_request "parse_*" RETURN parse_header'

pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("gcc")),
    reason="needs cmake, ninja and gcc (apt-get install cmake ninja-build gcc)")


class Project:
    """A copy of samples/cmake and its build folder."""

    def __init__(self, tmp: Path, generator: str = "Ninja"):
        self.tmp = tmp
        self.src = tmp / "src"
        self.build = tmp / "build"
        self.generator = generator
        shutil.copytree(SAMPLE, self.src)

    def configure(self):
        cmake_dir = check([sys.executable, "-m", "urewrite", "--cmake-dir"]).stdout.strip()
        return check(["cmake", "-S", self.src, "-B", self.build, "-G", self.generator,
                      f"-Durewrite_DIR={cmake_dir}", f"-DPython3_EXECUTABLE={sys.executable}",
                      "-DCMAKE_BUILD_TYPE=Release"])

    def cmake_build(self):
        return run(["cmake", "--build", self.build])

    def built(self):
        proc = self.cmake_build()
        assert proc.returncode == 0, f"build failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout + proc.stderr

    def edit(self, old: str, new: str):
        path = self.src / "CMakeLists.txt"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    @property
    def server(self) -> Path:
        return self.build / "server"

    @property
    def probed(self) -> Path:
        return self.build / "server.probed"


def rewrites(log: str):
    """The targets the build log says urewrite instrumented."""
    return re.findall(r"urewrite: instrumenting (\w+)", log)


@pytest.fixture(scope="module")
def ninja_project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("cmake-ninja"))
    project.configure()
    log = project.built()
    assert sorted(rewrites(log)) == ["demo", "server"], log
    return project


def test_cmake_dir_holds_the_package():
    d = Path(check([sys.executable, "-m", "urewrite", "--cmake-dir"]).stdout.strip())
    for name in ("urewriteConfig.cmake", "urewriteConfigVersion.cmake", "urewrite.cmake"):
        assert (d / name).is_file(), name


def test_program_counts_exactly(ninja_project, tmp_path):
    p = ninja_project
    original = check([p.server, N]).stdout
    assert original.startswith(f"handled {N} requests")
    assert check([p.probed, N]).stdout == original  # probes disarmed
    assert os.access(p.probed, os.X_OK)
    hits, out = stat([p.probed, N], tmp_path)
    assert out == original
    assert hits == SERVER_COUNTS


def test_original_stays_untouched(ninja_project, tmp_path):
    report = tmp_path / "report.json"
    urewrite("stat", "--json", "-o", report, "--", ninja_project.server, N)
    assert json.loads(report.read_text())["probes"] == []


def test_shared_library_counts_exactly(ninja_project, tmp_path):
    p = ninja_project
    assert (p.build / "probed" / "libdemo.so").is_file()
    original = check([p.build / "usedemo", N]).stdout
    hits, out = stat([p.build / "usedemo", N], tmp_path,
                     extra_env={"LD_LIBRARY_PATH": str(p.build / "probed")})
    assert out == original
    assert hits == DEMO_COUNTS


def test_command_is_the_tests_interpreter(ninja_project):
    args = (ninja_project.build / "CMakeFiles" / "urewrite" / "server_probed.args").read_text()
    commands = re.findall(r"^command (.*)$", args, re.M)
    here = os.path.dirname(sys.executable)
    assert commands in ([os.path.join(here, "urewrite")], [sys.executable, "-m", "urewrite"]), args


def test_nothing_changed_nothing_rerun(ninja_project):
    p = ninja_project
    before = p.probed.stat().st_mtime_ns
    log = p.built()
    assert "no work to do" in log and not rewrites(log), log
    # Configuring again with nothing changed rewrites no argument file, so nothing re-runs.
    p.configure()
    log = p.built()
    assert "no work to do" in log and not rewrites(log), log
    explain = check(["ninja", "-C", p.build, "-n", "-d", "explain"])
    assert "server.probed" not in explain.stdout + explain.stderr
    assert p.probed.stat().st_mtime_ns == before


def test_input_change_reruns(tmp_path):
    p = Project(tmp_path)
    p.configure()
    p.built()
    source = p.src / "server.c"
    source.write_text(source.read_text().replace('"handled %lu', '"served %lu'))
    log = p.built()
    assert rewrites(log) == ["server"], log
    assert check([p.probed, 3]).stdout.startswith("served 3 requests")


def test_probe_list_change_reruns(tmp_path):
    p = Project(tmp_path)
    p.configure()
    p.built()
    p.edit(PROBES_LINE, PROBES_LINE.replace('"parse_*"', "parse_body"))
    log = p.built()
    assert rewrites(log) == ["server"], log
    hits, _ = stat([p.probed, N], tmp_path)
    assert hits == {"handle_request": N, "parse_body": N // 2, **OTHER_COUNTS}
    log = p.built()
    assert not rewrites(log), log


def test_unplaceable_probe_fails_the_build(tmp_path):
    p = Project(tmp_path)
    p.configure()
    p.built()
    p.edit(PROBES_LINE, PROBES_LINE.replace('"parse_*"', '"parse_*" no_such_function'))
    proc = p.cmake_build()
    assert proc.returncode != 0
    assert "urewrite: no function named 'no_such_function'" in proc.stdout + proc.stderr
    assert not p.probed.exists()  # no stale output left looking current
    assert p.server.exists()
    # Still failing on the next build: nothing was recorded as done.
    assert p.cmake_build().returncode != 0


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_makefiles(tmp_path):
    p = Project(tmp_path, generator="Unix Makefiles")
    p.configure()
    log = p.built()
    assert sorted(rewrites(log)) == ["demo", "server"], log
    hits, _ = stat([p.probed, N], tmp_path)
    assert hits == SERVER_COUNTS
    before = p.probed.stat().st_mtime_ns
    log = p.built()
    assert not rewrites(log), log
    assert p.probed.stat().st_mtime_ns == before
    # Make does not compare command lines: the argument file carries the probe list.
    p.edit(PROBES_LINE, PROBES_LINE.replace('"parse_*"', "parse_trailer"))
    log = p.built()
    assert rewrites(log) == ["server"], log
    hits, _ = stat([p.probed, N], tmp_path)
    assert hits == {"handle_request": N, "parse_trailer": (N + 2) // 3, **OTHER_COUNTS}


def _configure_only(tmp: Path, body: str, *defs: str):
    src = tmp / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(probe_config NONE)\n" + body)
    return run(["cmake", "-S", src, "-B", tmp / "build", *defs])


def test_found_through_prefix_path_and_include(tmp_path):
    cmake_dir = check([sys.executable, "-m", "urewrite", "--cmake-dir"]).stdout.strip()
    version = check([sys.executable, "-m", "urewrite", "--version"]).stdout.split()[-1]
    proc = _configure_only(
        tmp_path,
        f'find_package(urewrite {version} EXACT REQUIRED)\n'
        'message(STATUS "found=${urewrite_VERSION} run=${UREWRITE_COMMAND}")\n'
        f'include("{cmake_dir}/urewrite.cmake")\n',
        f"-DCMAKE_PREFIX_PATH={cmake_dir}", f"-DUREWRITE_EXECUTABLE={sys.executable};-m;urewrite")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"found={version} run={sys.executable};-m;urewrite" in proc.stdout


def test_unusable_executable_fails_find_package(tmp_path):
    cmake_dir = check([sys.executable, "-m", "urewrite", "--cmake-dir"]).stdout.strip()
    proc = _configure_only(tmp_path, "find_package(urewrite REQUIRED)\n",
                           f"-Durewrite_DIR={cmake_dir}", "-DUREWRITE_EXECUTABLE=false")
    assert proc.returncode != 0
    assert "urewrite: `false --version` failed" in proc.stderr


HOOK = ('#include "urewrite.h"\nUREWRITE_MAP(requests, UREWRITE_SUM, 0);\n'
        'void on_request(struct urewrite_context *ctx) '
        '{ urewrite_map_add(ctx, &requests, 0, STEP); }\n')


def test_a_callback_built_in_and_rebuilt_when_it_changes(tmp_path):
    """CALL file.c:function: the callback runs in the probed copy's probes (its maps in
    stat's report), and an edit of the C file re-runs the rewrite, this one alone."""
    p = Project(tmp_path)
    (p.src / "hook.c").write_text(HOOK.replace("STEP", "1"))
    with open(p.src / "CMakeLists.txt", "a") as f:
        f.write("urewrite_instrument(server TARGET server_counted OUTPUT server.counted "
                "PROBES handle_request CALL hook.c:on_request)\n")
    p.configure()
    p.built()

    def requests():
        report = tmp_path / "report.json"
        proc = urewrite("stat", "--json", "-o", report, "--", p.build / "server.counted", N)
        assert proc.returncode == 0, proc.stderr
        maps = json.loads(report.read_text())["programs"][0]["maps"]
        return [m["data"]["@requests"] for m in maps]
    assert requests() == [N]
    (p.src / "hook.c").write_text(HOOK.replace("STEP", "3"))
    log = p.built()
    assert rewrites(log) == ["server"], log  # (the server_counted copy)
    assert requests() == [3 * N]
