"""Recording a persistent program (bench/persistent_cuda.py) on the CPU: what the launches and
device copies queued while ``recording`` is active become (no CUDA call is made), the slots'
encoding, what a program refuses to hold, and the product's functions as they were after."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgeomni.plugins import attention_cuda as ac
from edgeomni.plugins import cuda_driver as cd
from edgeomni.runtime import memory
from edgeomni.runtime.memory import DeviceArray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import persistent_cuda as pc  # noqa: E402

SOURCE = 'extern "C" __global__ void k(const float* x, int n, long long m, float a, double b) {}'


def test_launches_and_device_copies_go_into_the_recording_program() -> None:
    kernel = SimpleNamespace(function=0xABC, source=SOURCE)  # a CudaAttention's fields
    plain = (ac.launch_kernel, DeviceArray.copy_from, DeviceArray.copy_positions)
    a = DeviceArray((4, 8), np.float32, 1 << 20, owner=False)
    b = DeviceArray((4, 8), np.float32, 2 << 20, owner=False)
    args = [ctypes.c_void_p(1 << 30), ctypes.c_int32(-3), ctypes.c_int64(-(1 << 40)),
            ctypes.c_float(1.5), ctypes.c_double(-0.25)]  # fmt: skip
    with pc.recording(pc.Program(), [kernel]) as program:
        ac.launch_kernel(0xABC, (3, 2), 64, 128, 0, args, overlap=True, what="k")
        a.copy_from(b)
        a.copy_positions(b, 1, 3, dst_start=1, src_start=4)  # a copy a row of the axes before
    assert (ac.launch_kernel, DeviceArray.copy_from, DeviceArray.copy_positions) == plain
    assert program.entries == [pc.Entry(0, ac.KERNEL_NAME, ("ptr", "i32", "i64", "f32", "f64")),
                               pc.Entry(-1, pc.COPY, ("ptr", "ptr", "i64"))]  # fmt: skip
    assert program.threads == 256 and program.shared == pc.ZONE + 128  # after the zone: k's
    table = program.table()
    assert table.shape == (6, pc.HEADER + 5)
    assert list(table[0, : pc.HEADER]) == [0, 3, 2, 1, 64]
    slots = table[0, pc.HEADER :]
    assert int(slots[0]) == 1 << 30
    assert slots[1:3].view(np.int64).tolist() == [-3, -(1 << 40)]  # sign-extended
    assert np.uint32(slots[3]).view(np.float32) == np.float32(1.5)
    assert slots[4:5].view(np.float64)[0] == -0.25
    assert table[1, pc.HEADER : pc.HEADER + 3].tolist() == [1 << 20, 2 << 20, 128]
    rows = [table[i, pc.HEADER : pc.HEADER + 3].tolist() for i in range(2, 6)]
    assert rows == [[(1 << 20) + (r * 8 + 1) * 4, (2 << 20) + (r * 8 + 4) * 4, 12]
                    for r in range(4)]  # fmt: skip
    assert program.pointer_slots() == [(0, pc.HEADER)] + [
        (i, pc.HEADER + j) for i in range(1, 6) for j in (0, 1)]  # fmt: skip
    text = program.source_text()
    assert 'extern "C"' not in text.split("namespace pk0", 1)[1].split("}  // namespace")[0]
    assert f"case 0: pk0::{ac.KERNEL_NAME}(PkPtr{{a[0]}}, (int)(long long)a[1]" in text
    assert "case 1: pk_copy(" in text


def test_what_a_program_cannot_hold_is_refused() -> None:
    a = DeviceArray((4,), np.float32, 1 << 20, owner=False)
    with pc.recording(pc.Program()):
        with pytest.raises(pc.ProgramError, match="no known module"):
            cd.launch_kernel(0xDEF, (1,), 32, 0, 0, [], what="unnamed")
        with pytest.raises(pc.ProgramError, match="between host and device inside a persistent"):
            a.upload(np.zeros(4, np.float32))
        with pytest.raises(pc.ProgramError, match="memset inside a persistent program"):
            a.fill_zero()
        with pytest.raises(pc.ProgramError, match="read to the host inside"):
            memory.HostRead.queue(None, a)  # type: ignore[arg-type]
        with pytest.raises(pc.ProgramError, match="already being recorded"), \
                pc.recording(pc.Program()):
            pass
    with pytest.raises(pc.ProgramError, match="block of 48 threads"):
        pc.Program().launch(SOURCE, "k", (1,), 48, 0, [])
    with pytest.raises(pc.ProgramError, match="empty grid"):
        pc.Program().launch(SOURCE, "k", (0, 1), 32, 0, [])
    with pytest.raises(pc.ProgramError, match="argument of type c_ubyte"):
        pc.Program().launch(SOURCE, "k", (1,), 32, 0, [ctypes.c_uint8(1)])
