"""The Bazel rules: samples/bazel built with Bazel (Debian's bazel-bootstrap, 4.2) in a temporary
folder, offline, in Bazel's sandbox.

urewrite_binary and urewrite_library must give files that behave like the originals and count
exactly under `urewrite stat`, run as sandboxed actions that Bazel caches (a second build runs
nothing; after `bazel clean` the disk cache answers), re-run when the probe list changes, and
fail the build with urewrite's message when a probe cannot be placed. The sample builds its
inputs with genrules calling gcc: Bazel 4.2's cc_binary downloads rules_cc.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from build_systems import check, run, stat, urewrite

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "bazel"
RULES = ROOT / "cli" / "share" / "bazel"
N = 10  # requests; see samples/bazel/server.c for the counts
# beyond entry probes: a return probe and a USDT probe (samples/cmake/server.c)
OTHER_COUNTS = {"parse_header (return)": N, "server:request": N}
SERVER_COUNTS = {"handle_request": N, "parse_header": N, "parse_body": N // 2,
                 "parse_trailer": (N + 2) // 3, **OTHER_COUNTS}
DEMO_COUNTS = {"demo_add": N, "demo_mul": 2 * N, "demo_scale": N}
SERVER_PROBES = '''    probes = [
        "handle_request",
        "parse_*",
    ],'''

needs_bazel = pytest.mark.skipif(
    not (shutil.which("bazel") and shutil.which("gcc")),
    reason="needs bazel and gcc (apt-get install bazel-bootstrap gcc)")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Workspace:
    """A copy of samples/bazel with its own Bazel output root and disk cache."""

    def __init__(self, tmp: Path):
        self.dir = tmp / "ws"
        shutil.copytree(SAMPLE, self.dir)
        self.root = tmp / "root"
        self.startup = [f"--output_user_root={self.root}", "--max_idle_secs=120"]
        rules = check([sys.executable, "-m", "urewrite", "--bazel-dir"]).stdout.strip()
        self.options = [f"--override_repository=urewrite={rules}", f"--disk_cache={tmp / 'cache'}",
                        "--nosandbox_debug", "--noshow_progress"]

    def bazel(self, command, *args):
        return run(["bazel", *self.startup, command, *self.options, *args], cwd=self.dir)

    def build(self, *targets):
        proc = self.bazel("build", *(targets or ["//..."]))
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"bazel build failed:\n{log}"
        return log

    def edit(self, old: str, new: str):
        path = self.dir / "BUILD.bazel"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    def shutdown(self):
        """Stop the server, then remove the output root (Bazel leaves it read-only)."""
        run(["bazel", *self.startup, "shutdown"], cwd=self.dir)
        run(["chmod", "-R", "u+w", self.root])
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def bin(self) -> Path:
        return self.dir / "bazel-bin"


def processes(log: str) -> str:
    """Bazel's summary of what ran: 'N processes: ...'."""
    found = re.findall(r"INFO: (\d+ process(?:es)?: .*)", log)
    assert found, log
    return found[-1]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = Workspace(tmp_path_factory.mktemp("bazel"))
    try:
        log = ws.build()
        assert "sandbox" in processes(log), log  # the actions ran sandboxed
        yield ws
    finally:
        ws.shutdown()


def test_rules_version_is_the_package_version():
    from urewrite import __version__
    defs = (RULES / "defs.bzl").read_text()
    assert re.search(r'^UREWRITE_VERSION = "([^"]+)"$', defs, re.M).group(1) == __version__


def test_bazel_dir_holds_the_rules():
    d = Path(check([sys.executable, "-m", "urewrite", "--bazel-dir"]).stdout.strip())
    for name in ("WORKSPACE", "BUILD.bazel", "defs.bzl", "urewrite_tool.sh"):
        assert (d / name).is_file(), name


@needs_bazel
def test_program_counts_exactly(workspace, tmp_path):
    original = check([workspace.bin / "server", N]).stdout
    probed = workspace.bin / "server_probed"
    assert os.access(probed, os.X_OK)
    assert check([probed, N]).stdout == original  # probes disarmed
    hits, out = stat([probed, N], tmp_path)
    assert out == original
    assert hits == SERVER_COUNTS


@needs_bazel
def test_shared_library_counts_exactly(workspace, tmp_path):
    usedemo = workspace.bin / "usedemo"
    original = check([usedemo, N], extra_env={"LD_LIBRARY_PATH": str(workspace.bin)}).stdout
    hits, out = stat([usedemo, N], tmp_path,
                     extra_env={"LD_LIBRARY_PATH": str(workspace.bin / "probed")})
    assert out == original
    assert hits == DEMO_COUNTS


@needs_bazel
def test_cached_like_any_artefact(workspace):
    probed = workspace.bin / "server_probed"
    before = (probed.stat().st_mtime_ns, digest(probed))
    log = workspace.build()
    assert processes(log) == "1 process: 1 internal.", log  # nothing ran
    assert (probed.stat().st_mtime_ns, digest(probed)) == before
    # A fresh output tree: every action comes back from the disk cache, the rewrite included.
    check(["bazel", *workspace.startup, "clean"], cwd=workspace.dir)
    log = workspace.build()
    summary = processes(log)
    assert "cache hit" in summary and "sandbox" not in summary, log  # Bazel 4.2: "remote cache hit"
    assert digest(probed) == before[1]


@needs_bazel
def test_probe_list_change_reruns(workspace, tmp_path):
    workspace.edit(SERVER_PROBES, '    probes = ["parse_body"],')
    try:
        log = workspace.build("//:server_probed")
        assert re.search(r"\b1 (linux-sandbox|processwrapper-sandbox|sandbox)", processes(log)), log
        hits, _ = stat([workspace.bin / "server_probed", N], tmp_path)
        assert hits == {"parse_body": N // 2, **OTHER_COUNTS}
    finally:
        workspace.edit('    probes = ["parse_body"],', SERVER_PROBES)


@needs_bazel
def test_unplaceable_probe_fails_the_build(workspace):
    build = workspace.dir / "BUILD.bazel"
    original = build.read_text()
    build.write_text(original + '\nurewrite_binary(name = "bad", src = ":server", '
                                'probes = ["handle_request", "no_such_function"])\n')
    try:
        proc = workspace.bazel("build", "//:bad")
        log = proc.stdout + proc.stderr
        assert proc.returncode != 0, log
        assert "urewrite: no function named 'no_such_function'" in log
        assert not (workspace.bin / "bad").exists()
    finally:
        build.write_text(original)


@needs_bazel
def test_a_callback_built_in(workspace, tmp_path):
    """call and call_function: the C file is an input of the action, compiled in its
    sandbox by the host's compiler; the callback's maps are in stat's report."""
    build = workspace.dir / "BUILD.bazel"
    original = build.read_text()
    (workspace.dir / "hook.c").write_text(
        '#include "urewrite.h"\nUREWRITE_MAP(requests, UREWRITE_COUNT, 0);\n'
        'void on_request(struct urewrite_context *ctx) { urewrite_map_add(ctx, &requests, 0, 0); }\n')
    build.write_text(original + '\nurewrite_binary(name = "server_counted", src = ":server", '
                                'probes = ["handle_request"], call = "hook.c", '
                                'call_function = "on_request")\n')
    try:
        workspace.build("//:server_counted")
        report = tmp_path / "report.json"
        proc = urewrite("stat", "--json", "-o", report, "--", workspace.bin / "server_counted", N)
        assert proc.returncode == 0, proc.stderr
        maps = json.loads(report.read_text())["programs"][0]["maps"]
        assert [m["data"]["@requests"] for m in maps] == [N]
    finally:
        build.write_text(original)
