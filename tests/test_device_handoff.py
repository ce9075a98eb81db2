"""A graphed decoder call on a GPU, with the device faked: host feeds are uploaded into fixed
buffers (and not again while unchanged), another engine's output buffer is copied device to
device and never visits the host."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgeomni.runtime import memory
from edgeomni.runtime.decoder import DecoderSession
from edgeomni.runtime.engine import OrtEngine


class FakeDeviceArray:
    """memory.DeviceArray's interface over a numpy array, counting the copies."""

    log: list[tuple[str, str]] = []

    def __init__(self, shape: tuple[int, ...], dtype: Any, data: np.ndarray | None = None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.data = np.zeros(shape, dtype) if data is None else data

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: Any) -> FakeDeviceArray:
        return cls(shape, dtype)

    def view(self, shape: tuple[int, ...]) -> FakeDeviceArray:
        return FakeDeviceArray(shape, self.dtype, self.data.reshape(shape))

    def upload(self, array: np.ndarray) -> None:
        assert array.shape == self.shape
        self.data[...] = array
        self.log.append(("upload", str(array.dtype)))

    def copy_from(self, src: FakeDeviceArray) -> None:
        assert src.dtype == self.dtype and src.data.size == self.data.size
        self.data[...] = src.data.reshape(self.shape)
        self.log.append(("device", str(src.dtype)))


class FakeBinding:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.inputs = engine, {}

    def bind_in_place(self, *args: Any) -> None:
        pass

    def bind_input(self, name: str, array: Any) -> None:
        self.inputs[name] = array

    def bind_output(self, name: str, array: Any) -> None:
        pass

    def run(self, feeds: dict, *, graph: int | None = None, wait: bool = True) -> None:
        self.engine.seen.append({k: v.data.copy() for k, v in self.inputs.items()})


class FakeEngine:
    device, cuda_graphs = "cuda", True
    input_names = ("inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices",
                   "gqa_seqlens_k", "gqa_total_length")  # fmt: skip
    output_names = ("logits",)
    input_types = {"inputs_embeds": np.dtype(np.float16)}
    output_types = {"logits": np.dtype(np.float16)}
    output_shapes = {"logits": ("batch", 5)}

    # a GPU build's GroupQueryAttention, its host-fed lengths as OrtEngine feeds them
    host_memory, graphs_decode, fixed_shapes, _host_lengths = False, True, False, True
    length_feeds = OrtEngine.length_feeds
    graph_feeds = OrtEngine.graph_feeds

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> FakeDeviceArray:
        return memory.DeviceArray.zeros(shape, dtype)

    def binding(self) -> FakeBinding:
        return FakeBinding(self)

    def new_graph_id(self) -> int:
        return 1


class FakeKV:
    capacity = 16

    def __init__(self) -> None:
        self.graph_slots: dict = {}

    def bind(self, *args: Any) -> None:
        pass


def test_device_embeds_are_copied_on_the_device(monkeypatch) -> None:
    monkeypatch.setattr(memory, "DeviceArray", FakeDeviceArray)
    FakeDeviceArray.log = []
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


def test_device_embeds_of_another_dtype_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(memory, "DeviceArray", FakeDeviceArray)
    session = DecoderSession(FakeEngine(), FakeKV(), 1, {"logits": (5,)})
    lengths = (np.zeros(1, np.int32), np.array([0]), np.ones(1, np.int32), np.zeros(1))
    with pytest.raises(ValueError, match="float32 device buffer for a float16 input"):
        session.run(FakeDeviceArray((1, 1, 4), np.float32), *lengths)


def test_unchanged_feeds_are_not_sent_again(monkeypatch) -> None:
    """A graphed slot's input buffers keep what was last uploaded: a repeated call sends only
    the feeds that changed; calls with different tags keep buffers (and graphs) of their own."""
    monkeypatch.setattr(memory, "DeviceArray", FakeDeviceArray)
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
