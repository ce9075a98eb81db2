"""Media pieces the Qwen3 families share at run time: log-mel features and the AuT audio
encoder (Qwen3-Omni's thinker, Qwen3-ASR), image preprocessing and the ViT with DeepStack taps
(Qwen3-Omni, Qwen3-VL), 3-axis rope positions, and the media hook base a family's own hook
builds on (hook.py). A family's package declares which hook its model type uses."""

from __future__ import annotations

__all__ = ["MediaError"]


class MediaError(ValueError):
    """A media file that cannot be taken: one line naming the file (``kind path: reason``), the
    same from edge-infer's flags, a request file's parts and edge-serve's inline media (whose
    paths the server replaces by the fields they came from). ``reason`` is the line without
    the file, for a caller that names it itself (a flag)."""

    def __init__(self, kind: str, path: str | object, reason: str) -> None:
        super().__init__(f"{kind} {path}: {reason}")
        self.kind, self.path, self.reason = kind, str(path), reason
