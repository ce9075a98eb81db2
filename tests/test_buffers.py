"""The buffer interface engines hand out (a CPU engine's numpy buffers: in place, no copies the
old code did not make), device ids in configs, how runners open engines (Engines), and the
attention lengths a binding derives for its lowering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime import engine as engine_mod
from edgeomni.runtime.buffers import DeviceBuffers, FixedInputs, HostBuffers
from edgeomni.runtime.engine import EngineError, Engines, parse_device
from edgeomni.runtime.memory import BESIDE


def test_host_buffers_are_numpy_arrays_worked_in_place() -> None:
    memory = HostBuffers()
    buf = memory.zeros((3, 2, 4, 5), np.float32)
    assert isinstance(buf, np.ndarray) and memory.on_host and not memory.resident(buf)
    rows = memory.rows(buf, 2, 1)
    assert rows.shape == (2, 2, 4, 5) and np.shares_memory(rows, buf)
    memory.upload(rows, np.ones((2, 2, 4, 5)))
    assert buf[0].sum() == 0 and (buf[1:] == 1).all()
    flat = memory.view(memory.rows(buf, 1, 2), (40,))
    assert np.shares_memory(flat, buf) and flat.shape == (40,)
    memory.copy_into(flat, np.arange(40.0))
    assert buf[2, 0, 0, 1] == 1.0
    assert memory.to_host(buf) is buf  # read in place
    copied, downloaded = memory.copy(buf), memory.download(buf)
    assert not np.shares_memory(copied, buf) and not np.shares_memory(downloaded, buf)
    np.testing.assert_array_equal(copied, buf)
    memory.synchronize()  # nothing queued


def test_a_cache_row_moves_only_its_filled_positions() -> None:
    memory = HostBuffers()
    cache = np.arange(2 * 1 * 4 * 2, dtype=np.float32).reshape(2, 1, 4, 2)
    before = cache.copy()
    memory.copy_row(cache, 1, 0, 3, axis=1)
    np.testing.assert_array_equal(cache[0, :, :3], before[1, :, :3])
    np.testing.assert_array_equal(cache[0, :, 3:], before[0, :, 3:])  # past its length: left


class Dev:
    """A device buffer over a numpy array (memory.DeviceArray's interface)."""

    def __init__(self, data: np.ndarray, ptr: int = 0) -> None:
        self.data, self.shape, self.dtype, self.device = data, data.shape, data.dtype, 0
        self.ptr, self.nbytes = ptr, data.nbytes
        self.log: list[str] = []

    def upload(self, array: np.ndarray) -> None:
        self.data[...] = array
        self.log.append("upload")

    def copy_from(self, src: Dev) -> None:
        self.data[...] = src.data
        self.log.append("device")

    def download(self, out: Any = None, *, sync: bool = True) -> np.ndarray:
        return self.data.copy()


def test_device_buffers_take_host_arrays_where_a_buffer_may_be() -> None:
    """A stage's own host array stays a host array (viewed, sliced, read as it is); a device
    buffer is copied on the device, a host array uploaded."""
    memory = DeviceBuffers(0)
    host = np.arange(6.0).reshape(2, 3)
    assert not memory.on_host and not memory.resident(host) and memory.resident(Dev(host))
    assert memory.view(host, (2, 1, 3)).shape == (2, 1, 3)
    assert memory.rows(host, 1, 1).tolist() == [[3.0, 4.0, 5.0]]
    assert memory.to_host(host) is host
    dst = Dev(np.zeros((2, 3)))
    memory.copy_into(dst, host)
    memory.copy_into(dst, Dev(host * 2))
    assert dst.log == ["upload", "device"] and (dst.data == host * 2).all()
    assert not memory.overlaps(host, [dst])


def test_fixed_inputs_send_what_changed() -> None:
    bound: dict[str, Any] = {}
    made: list[Dev] = []

    class Memory(DeviceBuffers):
        def zeros(self, shape: tuple[int, ...], dtype: Any) -> Dev:
            made.append(Dev(np.zeros(shape, dtype)))
            return made[-1]

    fixed = FixedInputs(Memory(), bound.__setitem__)
    for value in (np.array([1, 2]), np.array([1, 2]), np.array([1, 3])):
        fixed.put("past_lens", value)
    assert list(bound) == ["past_lens"] and made[0].log == ["upload", "upload"]
    fixed.put("past_lens", Dev(np.array([7, 7])))  # another engine's buffer: on the device
    fixed.put("past_lens", np.array([1, 3]))  # sent again: the buffer no longer holds it
    assert made[0].log == ["upload", "upload", "device", "upload"] and len(made) == 1


@pytest.mark.parametrize(
    ("text", "want"),
    [("cpu", ("cpu", 0)), ("cuda", ("cuda", 0)), ("cuda:0", ("cuda", 0)), ("cuda:3", ("cuda", 3))],
)
def test_devices_are_parsed(text: str, want: tuple[str, int]) -> None:
    assert parse_device(text) == want


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "cuda:١", None])
def test_bad_devices_are_refused(text: Any) -> None:
    with pytest.raises(EngineError, match="is not cpu, cuda or cuda:N"):
        parse_device(text)


def test_a_config_may_name_its_gpu(tmp_path: Path, monkeypatch) -> None:
    """check_engine takes "cuda:N" as a cuda engine (the GPU's presence is checked for that
    index) and refuses a device it cannot parse, naming the forms it takes."""
    (tmp_path / "model.engine").write_bytes(b"x")
    checked: list[int] = []
    monkeypatch.setattr(engine_mod, "_check_cuda", lambda path, backend, device=0:
                        checked.append(device))  # fmt: skip
    config = {"backend": "tensorrt", "engine": "model.engine", "device": "cuda:2"}
    assert engine_mod.check_engine(tmp_path, config) == "cuda:2" and checked == [2]
    with pytest.raises(EngineError, match="cuda:N for the GPU of index N"):
        engine_mod.check_engine(tmp_path, {**config, "device": "cuda:two"})


def test_engines_open_with_the_pipelines_options(monkeypatch) -> None:
    opened: list[dict] = []
    monkeypatch.setattr(engine_mod, "open_engine", lambda folder, config, **kw: opened.append(kw))
    engines = Engines(threads=2, cuda_graphs=True, spin=True)
    engines.open(Path("."), {})
    engines.open(Path("."), {}, spin=False)
    engines.alone(False).open(Path("."), {}, replay=False)
    Engines(cuda_graphs=False).open(Path("."), {})
    Engines(lane=BESIDE).open(Path("."), {})
    assert opened == [
        {"threads": 2, "cuda_graphs": True, "spin": True, "lane": 0},
        {"threads": 2, "cuda_graphs": True, "spin": False, "lane": 0},
        {"threads": 2, "cuda_graphs": False, "spin": False, "lane": 0},
        {"threads": None, "cuda_graphs": False, "spin": True, "lane": 0},
        {"threads": None, "cuda_graphs": True, "spin": True, "lane": BESIDE},
    ]
    assert engines.alone(True) is engines


def test_engines_say_which_configs_engines_capture_graphs() -> None:
    """What edge-serve's warm-up asks: a GPU engine opened with CUDA graphs on captures each
    call shape on its first run; a CPU engine, or any with them off, does not."""
    cuda, cpu = {"backend": "fused", "device": "cuda:1"}, {"backend": "onnxruntime"}
    assert Engines().captures(cuda) and not Engines().captures(cpu)
    assert not Engines(cuda_graphs=False).captures(cuda)


def test_a_binding_feeds_its_lowerings_lengths() -> None:
    """OrtBinding: the attention lengths a graph has no input for are dropped; a lowering that
    reads GroupQueryAttention's lengths gets them from them; other feeds pass as they are."""
    pytest.importorskip("onnxruntime")
    from edgeomni.runtime.engine import OrtBinding

    class IO:
        def __init__(self) -> None:
            self.cpu: dict[str, np.ndarray] = {}

        def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
            self.cpu[name] = array

    class Session:
        def io_binding(self) -> IO:
            self.io = IO()
            return self.io

        def run_with_iobinding(self, io: IO, options: Any) -> None:
            pass

    lengths = {"past_lens": np.array([3, 0], np.int32), "query_lens": np.array([1, 2], np.int32)}
    session = Session()
    OrtBinding(session, inputs=("codes",)).run({"codes": np.zeros(2), **lengths})
    assert set(session.io.cpu) == {"codes"}
    OrtBinding(session, inputs=("x", *lengths)).run({"x": np.zeros(2), **lengths})
    assert set(session.io.cpu) == {"x", *lengths}
    gqa = ("x", "past_lens", "query_lens", "gqa_seqlens_k", "gqa_total_length")
    OrtBinding(session, inputs=gqa).run({"x": np.zeros(2), **lengths})
    assert set(session.io.cpu) == set(gqa)
    assert session.io.cpu["gqa_seqlens_k"].tolist() == [3, 1]
    assert session.io.cpu["gqa_total_length"].tolist() == [4]
    OrtBinding(session, inputs=("codes", "gqa_seqlens_k", "gqa_total_length")).run(
        {"codes": np.zeros(2), **lengths}
    )
    assert set(session.io.cpu) == {"codes", "gqa_seqlens_k", "gqa_total_length"}


def test_a_device_view_keeps_its_allocation() -> None:
    """A view of a device buffer (rows, reshaped) holds the allocation, as a numpy view holds
    its base: a function may return rows of a buffer it made (the stateful vocoder's new
    states) and the memory is not freed under them. Built over a pointer it does not own: no
    CUDA here."""
    import gc
    import weakref

    from edgeomni.runtime.memory import DeviceArray

    whole = DeviceArray((4, 3), np.float32, ptr=4096, owner=False, lane=BESIDE)
    gone = weakref.ref(whole)
    row = whole.rows(1, 2).view((3,))
    assert row.ptr == 4096 + 2 * 12 and row.base is whole
    assert row.lane == BESIDE  # its copies are ordered on its allocation's stream
    del whole
    gc.collect()
    assert gone() is not None and row.base is gone()
    del row
    gc.collect()
    assert gone() is None


def test_a_buffer_of_the_other_kind_is_refused_by_name() -> None:
    """A device buffer given to a CPU engine's buffers, or a host array where a GPU engine's own
    buffer is written, is a caller's bug: a TypeError saying so (a pointer not owned: no CUDA)."""
    from edgeomni.runtime.memory import DeviceArray

    dev = DeviceArray((2, 3), np.float32, ptr=4096, owner=False)
    with pytest.raises(TypeError, match="CPU engine's buffers are host arrays, not DeviceArray"):
        HostBuffers().rows(dev, 1)
    with pytest.raises(TypeError, match="GPU engine's buffer is a device array, not a host"):
        DeviceBuffers(0).upload(np.zeros((2, 3)), np.ones((2, 3)))
