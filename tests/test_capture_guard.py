"""runtime/memory.py's ``capturing``: while a CUDA graph is captured, Python's cycle collector
stays off (a collection could finalise an ONNX Runtime session, whose cudaFreeHost a capture
forbids: onnxruntime-gpu aborts the process), and it comes back as it was, nested or not."""

from __future__ import annotations

import gc

from edgeomni.runtime import memory


def test_capturing_holds_the_cycle_collector_off_and_restores_it() -> None:
    assert gc.isenabled()
    with memory.capturing():
        assert not gc.isenabled()
        with memory.capturing():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer capture is still running
    assert gc.isenabled()
    gc.disable()
    try:
        with memory.capturing():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
