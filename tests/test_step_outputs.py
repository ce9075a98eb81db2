"""StepOutputs: device outputs reach the host only when read, several with one synchronisation."""

from __future__ import annotations

import numpy as np

from edgeomni.runtime import memory
from edgeomni.runtime.buffers import DeviceBuffers
from edgeomni.runtime.decoder import StepOutputs


class FakeDevice:
    """Stands in for a DeviceArray: counts the copies a StepOutputs queues."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value
        self.copies = 0

    def download(self, out=None, *, sync: bool = True):  # noqa: ANN001, ANN201
        assert not sync  # StepOutputs queues copies and synchronises once
        self.copies += 1
        return self.value.copy()


def test_outputs_are_copied_once_and_only_when_read(monkeypatch) -> None:
    syncs = []
    monkeypatch.setattr(memory, "synchronize", lambda device=0, lane=0: syncs.append(device))
    logits = FakeDevice(np.arange(12, dtype=np.float32).reshape(2, 6))
    values = FakeDevice(np.array([[5.0, 4.0], [11.0, 10.0]], np.float32))
    indices = FakeDevice(np.array([[5, 4], [5, 4]], np.int64))
    hidden = np.ones((2, 3), np.float32)  # a host buffer is returned as it is
    out = StepOutputs(2, {"logits": logits, "topk_values": values, "topk_indices": indices,
                          "last_hidden": hidden}, DeviceBuffers())  # fmt: skip
    step = out.logits()
    assert len(syncs) == 1 and (values.copies, indices.copies, logits.copies) == (1, 1, 0)
    np.testing.assert_array_equal(step.topk_indices, indices.value)
    assert out["last_hidden"] is hidden and out["topk_values"] is step.topk_values
    np.testing.assert_array_equal(step.full(np.array([1])), logits.value[1:])
    assert logits.copies == 1 and len(syncs) == 2  # the full logits only when asked for
    out.fetch("logits", "missing")  # already here; names the call did not output are skipped
    assert logits.copies == 1 and len(syncs) == 2
