"""eh_frame.read_cie, the one reader of CIEs both the FDE walk (entry frames, LSDAs)
and unwind_rows use, each with its own policy for what it cannot read."""

import pytest

from urewrite.rewriter import unwind_rows
from urewrite.rewriter.eh_frame import (Truncated, UnsupportedEncoding, ValueReader, _Walker,
                                        read_cie)


def _cie(augmentation: bytes, data: bytes = b"", version: int = 1, extra: bytes = b"") -> bytes:
    """A CIE's bytes from its version on: code alignment 1, data alignment -8, return
    register 16, then the augmentation data (with its length where 'z'), then
    DW_CFA_def_cfa r7 + 8."""
    body = bytes([version]) + augmentation + b"\0" + extra + b"\x01\x78\x10"
    if augmentation.startswith(b"z"):
        body += bytes([len(data)]) + data
    return body + b"\x0c\x07\x08"


def _read(body: bytes, debug: bool = False):
    return read_cie(ValueReader(body, 0x1000), 0, len(body), debug)


def test_the_fields_and_the_letters():
    cie = _read(_cie(b"zPLR", b"\x00" + b"\x00" * 8 + b"\x1b" + b"\x1b"))
    assert (cie.version, cie.augmentation, cie.code_alignment, cie.data_alignment,
            cie.return_register) == (1, b"zPLR", 1, -8, 16)
    assert cie.augmented and (cie.pointer_encoding, cie.lsda_encoding) == (0x1B, 0x1B)
    assert not cie.unknown_letter
    assert cie.instructions == len(_cie(b"zPLR", b"\0" * 11)) - 3  # the rules follow the data


def test_no_augmentation_and_an_old_gccs_eh_word():
    plain = _read(_cie(b""))
    assert not plain.augmented and plain.pointer_encoding is None
    eh = _read(_cie(b"eh", extra=b"\xaa" * 8))
    assert (eh.return_register, eh.instructions) == (16, len(_cie(b"eh", extra=b"\0" * 8)) - 3)


def test_an_unknown_letter_stops_the_letters_and_each_reader_decides():
    cie = _read(_cie(b"zXR", b"\x1b"))
    assert cie.unknown_letter and cie.pointer_encoding is None
    # the FDE walk: 'R' hidden past it, so no FDE of it can be read
    frame = b"\0\0\0\0" + _cie(b"zXR", b"\x1b")
    data = len(frame).to_bytes(4, "little") + frame
    with pytest.raises(UnsupportedEncoding):
        _Walker(data, 0)._read_cie(8, len(data), 0)
    # ... while 'R' before it is known: the walk reads FDEs, the rows refuse the CIE
    known = b"\0\0\0\0" + _cie(b"zRX", b"\x1b")
    data = len(known).to_bytes(4, "little") + known
    assert _Walker(data, 0)._read_cie(8, len(data), 0) == 0x1B
    rows = unwind_rows.UnwindTable(data, 0, [], [])
    assert rows._read_cie(0) is None


def test_padded_personality_truncation_and_debug_frame_sizes():
    with pytest.raises(UnsupportedEncoding):
        _read(_cie(b"zP", b"\x50" + b"\0" * 8))
    with pytest.raises(Truncated):
        _read(_cie(b"zR")[:-4] + b"\x05")  # the data length runs past the end
    v4 = _read(_cie(b"", version=4, extra=b"\x08\x00"), debug=True)
    assert (v4.version, v4.return_register) == (4, 16)
    with pytest.raises(UnsupportedEncoding):
        _read(_cie(b"", version=4, extra=b"\x04\x00"), debug=True)
