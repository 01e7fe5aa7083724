"""The row of a probe armed live (`stat -p`): the trigger starts with its probes
disarmed, is armed through /proc/PID/mem while it waits, then runs its loop. The
hit path is the one an env-armed probe takes, so the row should match
`urewrite entry-nop`; the one-time set-up at the first hit falls inside the timed
loop (tens of microseconds over the whole run)."""

from __future__ import annotations

import subprocess

from urewrite.bench.common import RUN_TIMEOUT, BenchError, clean_env


def live_row(binary: str, trigger: str, iterations: int, threads: int):
    from urewrite.bench.rows import Row, _check_hits
    name = f"urewrite entry-{trigger} (live)"
    row = Row(name, "urewrite", "entry", trigger, threads, iterations)

    def measure() -> float:
        from urewrite.reader import arming
        from urewrite.trampolines.region import read_regions
        proc = subprocess.Popen([binary, trigger, str(iterations), str(threads)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=clean_env({"TRIGGER_WAIT": "1"}))
        armed = None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise BenchError(f"{name}: the trigger did not start")
            try:
                armed = arming.arm(proc.pid)
            except arming.LiveError as e:
                raise BenchError(f"{name}: {e}")
            out, err = proc.communicate("go\n", timeout=RUN_TIMEOUT)
            if proc.returncode != 0:
                raise BenchError(f"{name}: the trigger exited with {proc.returncode}: "
                                 f"{err.strip()}")
            arming.disarm(armed)  # it has exited: this only lets go of it
            counted = sum(p.hits for r in read_regions(armed.directory) for p in r.probes
                          if (p.name, p.kind) == (f"trigger_{trigger}", "entry"))
            _check_hits(name, counted, iterations * threads)
            return float(out.split()[0])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if armed is not None:
                arming.remove([armed])
    row.measure = measure
    return row
