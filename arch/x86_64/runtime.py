"""Assembles runtime.s for one rewritten file."""

from __future__ import annotations

import struct
from functools import lru_cache
from importlib import resources

import keystone

from urewrite.arch.base import Runtime, RuntimeSpec
from urewrite.trampolines import region

# Layout of the process-state memory (see runtime.s).
PS_STARTED = 4096
PS_DIR_TOO_LONG = 4096 + 8
PS_TCB = 4096 + 64
PS_DIR = 4096 + 256
DIR_MAX = 4096 - 256 - 1
PS_NAME = 8192
PS_ENVBUF = 12288
ENVBUF_SIZE = 1 << 20  # untouched pages cost nothing; a larger environment is read in part
STATE_SIZE = PS_ENVBUF + ENVBUF_SIZE

# Entry points, read back from the assembled code: label -> position in the exports table.
_EXPORTS = ("exe_start", "dso_start", "slow_hit", "lazy_init")
_LINK_FIELDS = 5  # lt_self, lt_state, lt_template, lt_tsize, lt_rsize


@lru_cache(maxsize=1)
def _source() -> str:
    return resources.files("urewrite.arch.x86_64").joinpath("runtime.s").read_text()


def build(spec: RuntimeSpec) -> Runtime:
    tag = spec.file_tag + b"\0"
    fields = {
        "TAG_BYTES": ", ".join(str(b) for b in tag),
        "ENV_VAR": region.ENV_VAR,
        "ENV_VAR_LEN": len(region.ENV_VAR) + 1,
        "EXE_ENTRY": spec.exe_entry if spec.exe_entry is not None else spec.base,
        "DSO_INIT": spec.dso_init if spec.dso_init is not None else spec.base,
        "PS_STARTED": PS_STARTED, "PS_DIR_TOO_LONG": PS_DIR_TOO_LONG, "PS_TCB": PS_TCB,
        "PS_DIR": PS_DIR, "DIR_MAX": DIR_MAX,
        "PS_NAME": PS_NAME, "PS_ENVBUF": PS_ENVBUF, "ENVBUF_SIZE": ENVBUF_SIZE,
        "OFF_PID": region.OFF_PID, "OFF_LOAD_BIAS": region.OFF_LOAD_BIAS,
        "OFF_OWNERS": region.OFF_OWNERS, "OFF_COUNTERS": region.OFF_COUNTERS,
        "OFF_SLOT_COUNT": region.OFF_SLOT_COUNT, "OFF_SLOT_STRIDE": region.OFF_SLOT_STRIDE,
        "OWNER_ENTRY_SIZE": region.OWNER_ENTRY_SIZE,
    }
    exports = "exports:\n" + "".join(f"    .quad {name}\n" for name in _EXPORTS)
    source = _source().format(**fields) + exports
    ks = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
    encoding, _ = ks.asm(source, spec.base)
    code = bytearray(encoding)
    addresses = struct.unpack_from(f"<{len(_EXPORTS)}Q", code, len(code) - 8 * len(_EXPORTS))
    entry = dict(zip(_EXPORTS, addresses))
    link = spec.base  # link_table is the first label
    struct.pack_into(f"<{_LINK_FIELDS}q", code, 0, link, spec.state - link, spec.template - link,
                     spec.template_size, spec.region_size)
    return Runtime(bytes(code), entry["exe_start"], entry["dso_start"], entry["slow_hit"],
                   entry["lazy_init"])
