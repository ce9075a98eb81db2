"""bench/stage_ort_sm90.py's fatbin walk on a made-up library: every payload of another
architecture zeroed, the kept architecture's bytes and every header untouched, bytes that only
look like the magic skipped, and a library without the architecture refused."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from stage_ort_sm90 import MAGIC, zero_other_archs  # noqa: E402


def _entry(arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", 2, 257, 64, len(payload)) + struct.pack("<4I", 0, 0, 0, arch)
    return header.ljust(64, b"\0") + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def test_other_architectures_are_zeroed_and_the_kept_one_is_not() -> None:
    decoy = struct.pack("<IHH", MAGIC, 7, 3)  # the magic inside other bytes: not a fatbin
    lib = bytearray(b"ELF..." + decoy + _fatbin(_entry(80, b"\x11" * 40), _entry(90, b"\x22" * 24))
                    + b"gap" + _fatbin(_entry(120, b"\x33" * 8), _entry(90, b"\x44" * 16)))  # fmt: skip
    before = bytes(lib)
    zeroed, kept = zero_other_archs(lib, 90)
    assert (zeroed, kept) == (48, 40)
    assert len(lib) == len(before)
    assert b"\x11" not in lib and b"\x33" not in lib
    assert lib.count(b"\x22") == 24 and lib.count(b"\x44") == 16
    assert lib.startswith(b"ELF..." + decoy) and b"gap" in lib
    changed = [i for i, (a, b) in enumerate(zip(before, lib, strict=True)) if a != b]
    assert len(changed) == 48  # the two payloads only: headers stay


def test_a_library_without_the_architecture_is_refused() -> None:
    with pytest.raises(SystemExit, match="no sm_90 code"):
        zero_other_archs(bytearray(_fatbin(_entry(80, b"\x11" * 8))), 90)
