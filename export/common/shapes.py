"""The sizes each component is called with, per phase: what a TensorRT build turns into
optimisation profiles (a TensorRT engine accepts only shapes inside one of its profiles).

A family's ``dim_ranges(ckpt, component, args)`` hook maps each phase name to the range of every
named dimension of the component's ONNX inputs: ``{phase: {dim: (min, opt, max)}}``. A range with
min == max is a fixed size (the KV cache's capacity, which TensorRT's in-place cache update needs
static). The ranges follow from the build's limits (``--max-batch-size``, ``--max-input-len``,
``--max-kv-cache-capacity``) and the runtime's calls; ONNX Runtime engines ignore them.
"""

from __future__ import annotations

from collections.abc import Mapping

Range = tuple[int, int, int]  # min, opt, max
DimRanges = Mapping[str, Mapping[str, Range]]  # phase -> dim name -> range


def fixed(n: int) -> Range:
    return (n, n, n)


def upto(n: int, lo: int = 1, opt: int | None = None) -> Range:
    """lo..n, tuned for ``opt`` (default n)."""
    return (lo, n if opt is None else opt, n)


def decoder_ranges(batch: int, prefill_len: int, capacity: int) -> dict[str, dict[str, Range]]:
    """A decoder's two phases: decode (one token per row, every row of a cohort) and prefill (up
    to ``prefill_len`` tokens per row, tuned for one row). The runtime picks the first phase that
    fits a call, so decode comes first."""
    cap = fixed(capacity)
    return {
        "decode": {"batch": upto(batch), "seq": fixed(1), "capacity": cap},
        "prefill": {
            "batch": upto(batch, opt=1),
            "seq": upto(min(prefill_len, capacity)),
            "capacity": cap,
        },
    }


def vocoder_ranges(batch: int, window: int, max_frames: int) -> dict[str, dict[str, Range]]:
    """A vocoder's two phases: streamed windows (``window`` frames with their left context, every
    row of a cohort) and whole utterances (up to ``max_frames``, tuned for one row)."""
    return {
        "window": {"batch": upto(batch), "frames": upto(window)},
        "utterance": {"batch": upto(batch, opt=1), "frames": upto(max_frames)},
    }
