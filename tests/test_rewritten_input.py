"""A file urewrite wrote, given again as input: one line that says so and names its
probes, exit 1, no output; and the reader accepts the legal layout it has (a
segment with no file bytes whose offset lies past the end of the file)."""

from __future__ import annotations

from pathlib import Path

from conftest import check, run, urewrite

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def test_a_rewritten_file_is_refused_with_its_probes(builder, tmp_path):
    built = builder.build("counts", ["counts.c"], ["-O2"])
    once = tmp_path / "once"
    proc = urewrite(str(built.path), "-p", "square", "-p", "fib", "-o", str(once))
    assert proc.returncode == 0, proc.stderr
    # the state segment: no file bytes, an offset past the end of the file
    segments = check(["readelf", "-lW", str(once)]).stdout
    assert any(line.split()[0] == "LOAD" and int(line.split()[1], 16) >= once.stat().st_size
               and int(line.split()[4], 16) == 0 for line in segments.splitlines()
               if line.strip().startswith("LOAD"))
    before = once.read_bytes()
    for args in ([str(once), "-p", "main", "-o", str(tmp_path / "twice")], ["list", str(once)]):
        proc = urewrite(*args)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert "already rewritten by urewrite (probes: " in proc.stderr
        assert "fib" in proc.stderr and "square" in proc.stderr
    assert not (tmp_path / "twice").exists() and once.read_bytes() == before


def test_a_file_without_section_headers_is_refused(builder, tmp_path):
    """It runs, but the scans that keep patches safe read sections: one line, exit 1."""
    built = builder.build("counts", ["counts.c"], ["-O2"])
    data = bytearray(built.path.read_bytes())
    data[40:48] = bytes(8)  # e_shoff
    data[58:64] = bytes(6)  # e_shentsize, e_shnum, e_shstrndx
    bare = tmp_path / "bare"
    bare.write_bytes(data)
    bare.chmod(0o755)
    assert run([bare]).returncode == run([built.path]).returncode
    for args in ([str(bare), "-p", "main", "-o", str(tmp_path / "out")], ["list", str(bare)]):
        proc = urewrite(*args)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "no section headers" in proc.stderr
    assert not (tmp_path / "out").exists()
