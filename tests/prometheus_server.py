"""A real Prometheus server (Debian's `prometheus` binary) for the export tests: it
scrapes `urewrite export` and answers queries of what it stored."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request

from conftest import clean_env
from live_service import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """Debian's prometheus binary on a free port, scraping `target` every second."""

    def __init__(self, target: str, workdir):
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: urewrite\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.base = f"http://127.0.0.1:{_free_port()}"
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={self.base[len('http://'):]}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=clean_env())
        wait_for(self._ready, timeout=60, step=0.2)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited: see prometheus.log"
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> dict:
        """{labels as a sorted tuple: value} of an instant query."""
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=30) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return {tuple(sorted(item["metric"].items())): float(item["value"][1])
                for item in answer["data"]["result"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
