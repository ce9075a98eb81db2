"""A graphed decoder call on a GPU, with the device faked: the engine's binding (ONNX Runtime's,
over a fake session) uploads host feeds into fixed buffers (and not again while unchanged),
copies another engine's output buffer device to device (it never visits the host), and feeds
GroupQueryAttention's lengths itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgeomni.runtime import memory
from edgeomni.runtime.buffers import DeviceBuffers
from edgeomni.runtime.decoder import DecoderSession

ort = pytest.importorskip("onnxruntime")

from edgeomni.runtime.engine import OrtBinding  # noqa: E402


class FakeDeviceArray:
    """memory.DeviceArray's interface over a numpy array, counting the copies; its pointer is
    a key into ``at``, where the session reads what a bound input holds."""

    log: list[tuple[str, str]] = []
    at: dict[int, FakeDeviceArray] = {}

    def __init__(self, shape: tuple[int, ...], dtype: Any, data: np.ndarray | None = None,
                 ptr: int | None = None):  # fmt: skip
        self.shape, self.dtype, self.device, self.lane = tuple(shape), np.dtype(dtype), 0, 0
        self.data = np.zeros(shape, dtype) if data is None else data
        self.ptr = len(self.at) + 1 if ptr is None else ptr
        self.nbytes = self.data.nbytes
        self.at.setdefault(self.ptr, self)

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: Any, device: int = 0,
              lane: int = 0) -> FakeDeviceArray:  # fmt: skip
        return cls(shape, dtype)

    def view(self, shape: tuple[int, ...]) -> FakeDeviceArray:
        return FakeDeviceArray(shape, self.dtype, self.data.reshape(shape), self.ptr)

    def upload(self, array: np.ndarray) -> None:
        assert array.shape == self.shape
        self.data[...] = array
        self.log.append(("upload", str(array.dtype)))

    def copy_from(self, src: FakeDeviceArray) -> None:
        assert src.dtype == self.dtype and src.data.size == self.data.size
        self.data[...] = src.data.reshape(self.shape)
        self.log.append(("device", str(src.dtype)))


class FakeSession:
    """What OrtBinding drives of an onnxruntime session: each run records what its inputs
    hold (a device input by its buffer, a CPU input as given)."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def io_binding(self) -> Any:
        class IO:
            def __init__(self) -> None:
                self.device: dict[str, int] = {}
                self.cpu: dict[str, np.ndarray] = {}

            def bind_input(self, name: str, kind: str, device: int, *args: Any) -> None:
                assert kind == "cuda"
                self.device[name] = args[-1]

            def bind_output(self, *args: Any) -> None:
                pass

            def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
                self.cpu[name] = array.copy()

        return IO()

    def run_with_iobinding(self, io: Any, options: Any) -> None:
        held = {n: FakeDeviceArray.at[p].data.copy() for n, p in io.device.items()}
        self.seen.append({**held, **io.cpu})


class FakeEngine:
    """A GPU build's decoder on ONNX Runtime, GroupQueryAttention's lengths fed by the host."""

    device = "cuda"
    input_names = ("inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices",
                   "gqa_seqlens_k", "gqa_total_length", "lm_head_index")  # fmt: skip
    output_names = ("logits",)
    input_types = {"inputs_embeds": np.dtype(np.float16)}
    output_types = {"logits": np.dtype(np.float16)}
    output_shapes = {"logits": ("batch", 5)}
    replays_steps, prefers_fixed_shapes = True, False

    def __init__(self) -> None:
        self.session = FakeSession()
        self.seen = self.session.seen
        self.buffers = DeviceBuffers(0)

    def binding(self) -> OrtBinding:
        return OrtBinding(self.session, True, inputs=self.input_names, buffers=self.buffers)

    def new_graph_id(self) -> int:
        return 1


class FakeKV:
    capacity = 16

    def __init__(self) -> None:
        self.graph_slots: dict = {}

    def bind(self, binding: Any, rows: int, start: int = 0) -> None:
        cache = FakeDeviceArray((rows, 1, self.capacity, 4), np.float16)
        binding.bind_in_place("past_key_0", "present_key_0", cache, capacity=self.capacity)


@pytest.fixture(autouse=True)
def fake_device(monkeypatch) -> None:
    monkeypatch.setattr(memory, "DeviceArray", FakeDeviceArray)
    FakeDeviceArray.log, FakeDeviceArray.at = [], {}


def test_device_embeds_are_copied_on_the_device() -> None:
    engine = FakeEngine()
    session = DecoderSession(engine, FakeKV(), 2, {"logits": (5,)})
    lengths = (np.zeros(2, np.int32), np.array([0, 0]), np.ones(2, np.int32), np.zeros(2))
    host = np.arange(2 * 4, dtype=np.float32).reshape(2, 1, 4)
    session.run(host, *lengths)
    # the talker's last_hidden [2, 4], float16, where the talker left it
    other = FakeDeviceArray((2, 4), np.float16, np.full((2, 4), 7, np.float16))
    session.run(other.view((2, 1, 4)), *lengths)
    embeds = [seen["inputs_embeds"] for seen in engine.seen]
    np.testing.assert_array_equal(embeds[0], host.astype(np.float16))  # converted, uploaded
    np.testing.assert_array_equal(embeds[1], other.data.reshape(2, 1, 4))
    # one fixed input buffer per name; the second call's embeddings never passed the host
    first, second = FakeDeviceArray.log[:6], FakeDeviceArray.log[6:]
    assert all(kind == "upload" for kind, _ in first)
    assert ("device", "float16") in second and ("upload", "float16") not in second


def test_device_embeds_of_another_dtype_are_refused() -> None:
    session = DecoderSession(FakeEngine(), FakeKV(), 1, {"logits": (5,)})
    lengths = (np.zeros(1, np.int32), np.array([0]), np.ones(1, np.int32), np.zeros(1))
    with pytest.raises(ValueError, match="float32 device buffer for a float16 input"):
        session.run(FakeDeviceArray((1, 1, 4), np.float32), *lengths)


def test_unchanged_feeds_are_not_sent_again() -> None:
    """A graphed slot's input buffers keep what was last uploaded: a repeated call sends only
    the feeds that changed; calls with different tags keep buffers (and graphs) of their own.
    The captured graph's total length is frozen at the cache's capacity."""
    engine = FakeEngine()
    kv = FakeKV()
    session = DecoderSession(engine, kv, 2, {"logits": (5,)})
    past = np.array([3, 3], np.int32)
    lengths = (np.array([[3], [3]]), past, np.ones(2, np.int32), np.zeros(2))
    embeds = np.zeros((2, 1, 4), np.float32)
    for call, tag in enumerate((1, 2, 1, 2)):  # a frame's two steps, twice
        FakeDeviceArray.log = []
        session.run(embeds + call, *lengths, tag=tag, lm_head_index=np.array([tag]))
        sent = len(FakeDeviceArray.log)
        assert sent == (7 if call < 2 else 1)  # then only the new embeddings
    assert len(kv.graph_slots) == 2
    np.testing.assert_array_equal(engine.seen[2]["inputs_embeds"], np.full((2, 1, 4), 2))
    np.testing.assert_array_equal(engine.seen[3]["lm_head_index"], [2])
    FakeDeviceArray.log = []
    session.run(embeds + 2, lengths[0], past + 1, *lengths[2:], tag=1, lm_head_index=np.array([1]))
    # past_lens changed, and with it the attention lengths; the embeddings did not
    assert len(FakeDeviceArray.log) == 2
    np.testing.assert_array_equal(engine.seen[-1]["past_lens"], past + 1)
    np.testing.assert_array_equal(engine.seen[-1]["gqa_seqlens_k"], [4, 4])
    assert {seen["gqa_total_length"].item() for seen in engine.seen} == {FakeKV.capacity}
