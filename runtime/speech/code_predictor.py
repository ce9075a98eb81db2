"""The code predictor (Qwen3-Omni's and Qwen3-TTS's), run by the talker's stage: the residual
codes of a codec frame from the talker's hidden state and the frame's first code.

A dense decoder with one head per residual group; its KV cache lives for one frame. Each frame is
a prefill ([hidden, E(code0)]) and one step per group. An engine built with a sampler
(export/common/sampler.py, cuda builds) draws each code itself and feeds the next step the drawn
code's embedding on the device, so a frame's steps run back to back (``engine_frame``), captured
as one CUDA graph where the engine captures sequences of calls (the fused backend); otherwise,
or when the engine cannot draw a frame exactly, the host draws each code from the step's logits
(``host_frame``). Both draw the same codes from the same generator. The engine's frame starts
with two one-token calls (the talker's hidden state, then E(code0): both may be device buffers,
and one-token calls are replayed from graphs); the host's with one two-token call of host arrays.
A frame engine (export/common/predictor_frame.py, the CPU's build: config.json's ``calls`` is
"frame") runs the host's frame, draws and embedding sum included, in one call
(``whole_frame``), from the same uniform numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.decoder import DecoderSession, StepOutputs, text_positions
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.engine_api import EngineError
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.sampling import SamplingParams, sample_step

# a frame engine's (export/common/predictor_frame.py) config value of "calls", and its outputs
FRAME_CALLS = "frame"
FRAME_CODES, FRAME_EMBEDS = "frame_codes", "frame_embeds"


def cp_artifact(groups: int) -> Artifact:
    """The code predictor's folder, for a talker of ``groups`` code groups: one embedding table
    per residual group."""
    return Artifact(
        keys=("hidden_size", "vocab_size", "num_hidden_layers", "num_key_value_heads", "head_dim",
              "state"),  # fmt: skip
        tables={"embedding.safetensors": tuple(f"embedding_{i}" for i in range(int(groups) - 1))},
    )


class FrameCalls:
    """A frame engine's calls for ``rows`` rows: its output buffers and the embedding tables
    [G-1, V, E], bound once, and the time spent inside its runs (what a DecoderSession reports
    as ``engine_seconds``)."""

    def __init__(self, engine: Any, rows: int, groups: int, width: int, tables: Any) -> None:
        self.rows = rows
        self.codes = np.zeros((rows, groups - 1), np.int64)
        self.embeds = np.zeros((rows, width), np.float32)
        self.binding = engine.binding()
        self.binding.bind_output(FRAME_CODES, self.codes)
        self.binding.bind_output(FRAME_EMBEDS, self.embeds)
        self.binding.bind_input("code_tables", tables)
        self.engine_seconds = 0.0

    def run(self, feeds: dict[str, Any]) -> None:
        start = time.perf_counter()
        self.binding.run(feeds)
        self.engine_seconds += time.perf_counter() - start


class CodePredictor:
    def __init__(
        self,
        folder: Path,
        *,
        groups: int,
        max_batch: int,
        engines: Engines = DEFAULT_ENGINES,
    ) -> None:
        self.config = cfg = check_folder(folder, cp_artifact(groups)).config
        # a frame engine runs a frame's steps and draws in one call (the CPU's build)
        self.whole_frames = cfg.get("calls") == FRAME_CALLS
        # its calls alternate with the talker's: its CPU threads do not spin between them
        self.engine = engines.open(folder, cfg, spin=False)
        self.groups = groups
        # its inputs' width: the talker's (Qwen3-TTS maps them to its own width in the engine)
        self.hidden_size = int(cfg.get("input_size") or cfg["hidden_size"])
        missing = {FRAME_CODES, FRAME_EMBEDS} - set(self.engine.output_names)
        if self.whole_frames and missing:
            raise EngineError(f"{folder}: config.json says calls {FRAME_CALLS!r}, but its "
                              f"engine has no output {', '.join(sorted(missing))}: rebuild it")  # fmt: skip
        # an engine that draws its own codes runs a frame's steps back to back, each fed the
        # code embedding the one before drew, on the device
        self.draws = "sampled_ids" in self.engine.output_names
        self.topk = int(self.engine.output_shapes["topk_values"][-1]) if self.draws else 0
        # a frame's calls as one graph a cohort shape: the talker's hidden state and the draw
        # settings copied into buffers the graph reads (see _graphed_frame)
        self.frame_graphs = self.draws and self.engine.captures_sequences
        # the frame's summed embedding made on the device too, inside the frame's graph, so
        # the talker's next call reads it there (queue_frame)
        self.sums_frames = self.frame_graphs and self.engine.sums_frames
        self._sums: dict[tuple[int, Any], tuple[Any, Any, Any, Any]] = {}  # _sum_buffers
        self._frames: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # graph, its hidden in
        self._settings: dict[str, Any] = {}
        self._settings_sent: tuple[float, ...] = ()
        self._lm_heads = [np.array([g], np.int64) for g in range(groups - 1)]  # made once
        tables = safetensors_np.load(folder / "embedding.safetensors")
        self.embeddings = [tables[f"embedding_{i}"] for i in range(groups - 1)]
        self._tables = None
        if self.whole_frames:  # stacked once for the frame engine, the host's tables views of it
            self._tables = np.ascontiguousarray(np.stack(self.embeddings), np.float32)
            self.embeddings = list(self._tables)
            del tables
        self.state = RowState.for_engine(cfg, max_batch, self.engine, groups, folder / "config.json")
        self._drawn: dict[tuple[int, int], tuple[Any, list[Any]]] = {}  # buffer, its rows
        self._readers: dict[tuple[int, ...], list[Any]] = {}  # queued frames' codes (_reader)
        self._staging: dict[tuple[int, int], tuple[Any, Any, list[Any]]] = {}

    def session(self, rows: int) -> DecoderSession | FrameCalls:
        if self.whole_frames:
            return FrameCalls(self.engine, rows, self.groups, self.hidden_size, self._tables)
        outputs: dict[str, tuple[int, ...]] = {"logits": (int(self.config["vocab_size"]),)}
        if self.draws:
            outputs.update(sampled_ids=(), sampled_embeds=(self.hidden_size,))
        return DecoderSession(self.engine, self.state, rows, outputs)

    def draws_in_engine(self, params: SamplingParams) -> bool:
        """Whether the engine can draw with these settings as the host would (its top-K must
        hold the top-k); a frame engine draws every setting."""
        if self.whole_frames:
            return True
        return self.draws and (params.greedy or 0 < params.top_k < self.topk)

    def frame(
        self,
        cp: DecoderSession | FrameCalls,
        last_hidden: Any,
        code0: np.ndarray,
        e0: np.ndarray,
        params: SamplingParams,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Codes [n, G] and the frame's summed embedding for every row, and whether the
        host drew a frame the engine was to draw. ``last_hidden`` [n, H]: the talker's output
        buffer as it is (on a GPU it never leaves the device), or a host array. ``e0``: the first codes' embeddings (the talker's table)."""
        if isinstance(cp, FrameCalls):
            return (*self.whole_frame(cp, last_hidden, code0, e0, params, rngs), False)
        in_engine = self.draws_in_engine(params)
        drawn = self.engine_frame(cp, last_hidden, code0, e0, params, rngs) if in_engine else None
        if drawn is not None:
            return (*drawn, False)
        return (*self.host_frame(cp, last_hidden, code0, e0, params, rngs), in_engine)

    def whole_frame(
        self,
        cp: FrameCalls,
        last_hidden: Any,
        code0: np.ndarray,
        e0: np.ndarray,
        params: SamplingParams,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray]:
        """``host_frame`` in one call of a frame engine: it draws each code from the uniform
        numbers the host path would take, in its order (group by group, each row its own
        generator), and sums the frame's embeddings as ``_summed`` does."""
        uniforms = self._uniforms(params, rngs)
        hidden = self.engine.buffers.to_host(last_hidden)[:, None, :]
        cp.run({"talker_hidden": np.ascontiguousarray(hidden, np.float32),
                "first_embeds": np.ascontiguousarray(e0[:, None, :], np.float32),
                **self._draw_inputs(uniforms, params)})  # fmt: skip
        return np.concatenate([code0[:, None], cp.codes], axis=1), cp.embeds.copy()

    def host_frame(
        self,
        cp: DecoderSession,
        last_hidden: Any,
        code0: np.ndarray,
        e0: np.ndarray,
        params: SamplingParams,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The code predictor's loop for one frame of every row, on host arrays: [hidden, E(c0)]
        in one call, then one step per residual group; returns codes [n, G] and the frame's
        summed embedding."""
        n = len(code0)
        q = np.ones(n, np.int32)
        codes = np.zeros((n, self.groups), np.int64)
        codes[:, 0] = code0
        draw = self._draw_inputs(np.zeros(n), SamplingParams(temperature=0.0)) if self.draws else {}
        hidden = self.engine.buffers.to_host(last_hidden)[:, None, :]
        past, x = np.zeros(n, np.int32), np.concatenate([hidden, e0[:, None, :]], axis=1)
        for group in range(1, self.groups):
            out = self._step(cp, x, past, q, group, draw, wait=True)
            codes[:, group] = sample_step(out.logits(), params, rngs)[0]
            past = past + x.shape[1]
            x = self.embeddings[group - 1][codes[:, group]][:, None, :]
        return codes, self._summed(codes, e0)

    def _step(
        self, cp: DecoderSession, x: Any, past: np.ndarray, q: np.ndarray, group: int,
        draw: dict[str, Any], *, wait: bool,
    ) -> StepOutputs:  # fmt: skip
        """The step that gives residual group ``group``'s code from ``x`` [n, width, H]. On a
        GPU each step has its own graph: its positions, lengths and head are sent once, and
        each frame sends only the new embedding."""
        width = x.shape[1]
        return cp.run(x, text_positions(past, width, False), past, q * width,
                      np.full(len(q), width - 1, np.int64), tag=group, wait=wait,
                      lm_head_index=self._lm_heads[group - 1], **draw)  # fmt: skip

    def _summed(self, codes: np.ndarray, e0: np.ndarray) -> np.ndarray:
        """A frame's summed code embeddings [n, H] (float32): E(c0) plus each residual's."""
        total = e0.astype(np.float32)  # a copy
        for group in range(1, self.groups):
            total += self.embeddings[group - 1][codes[:, group]]
        return total

    def _uniforms(
        self, params: SamplingParams, rngs: Sequence[np.random.Generator]
    ) -> np.ndarray:
        """A frame's uniform numbers [G-1, n], those the host path draws, in its order: each
        row's from its own generator, group by group (none when greedy)."""
        steps = self.groups - 1
        if params.greedy:
            return np.zeros((steps, len(rngs)))
        return np.stack([r.random(steps) for r in rngs], axis=1)

    @staticmethod
    def _draw_inputs(uniform: Any, params: SamplingParams) -> dict[str, Any]:
        """The engine sampler's inputs: greedy is top-k 1 at temperature 1 (and uniform 0)."""
        greedy = params.greedy
        return {
            # float64: a host array, or a row of a GPU frame's staged numbers (read where it is)
            "sample_uniform": uniform,
            "sample_temperature": np.array([1.0 if greedy else params.temperature]),
            "sample_top_k": np.array([1 if greedy else params.top_k], np.int64),
            "sample_top_p": np.array([1.0 if greedy else params.top_p]),
        }

    def engine_frame(
        self,
        cp: DecoderSession,
        last_hidden: Any,
        code0: np.ndarray,
        e0: np.ndarray,
        params: SamplingParams,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``host_frame`` with the engine drawing each code and feeding its embedding to
        the next step where it is: on a GPU the frame's calls are queued back to back and the
        host waits once, for the codes. The uniform numbers are the ones the host path would
        draw, in its order (group by group, every row); None, with the generator put back, when
        the engine could not decide a row exactly (the caller then draws the frame on
        the host, as it would have)."""
        n = len(code0)
        state = [r.bit_generator.state for r in rngs]
        steps = self.groups - 1
        uniforms = self._uniforms(params, rngs)
        q = np.ones(n, np.int32)
        uniform_rows, e0_in = self._staged(uniforms, e0)
        drawn, drawn_rows = self._drawn_codes(steps, n)
        if self.frame_graphs:
            self._graphed_frame(cp, last_hidden, e0_in, q, params, uniform_rows, drawn_rows)
        else:  # the same settings every call
            draw = self._draw_inputs(np.zeros(n), params)
            self._queue_frame(cp, last_hidden, e0_in, q, draw, uniform_rows, drawn_rows)
        codes = _decided(self.engine.buffers.to_host(drawn), code0, rngs, state)
        return None if codes is None else (codes, self._summed(codes, e0))

    def queue_frame(
        self,
        cp: DecoderSession | FrameCalls,
        last_hidden: Any,
        code0: np.ndarray | None,
        e0: np.ndarray | None,
        add: np.ndarray,
        params: SamplingParams,
        rngs: Sequence[np.random.Generator],
        dtype: Any,
        before: Callable[[], None] | None = None,
    ) -> QueuedFrame | None:
        """``engine_frame`` with the frame's summed embedding plus ``add`` [n, H] (the talker's
        next text rows) made on the device too, in ``dtype`` (the talker's input type), all in
        the frame's graph; nothing waited for. None where the engine cannot (it captures no
        sequences or sums no frames, or cannot draw with these settings): then call
        ``frame``. Its codes are read, and a row the engine could not decide redrawn on the
        host, when QueuedFrame.codes is called. ``code0`` and ``e0`` None: the first codes
        were drawn on the device, their embeddings written to ``first_inputs``' buffers, and
        QueuedFrame.first gives them to the host later. ``before``: called right before the
        frame's graph is launched, once its inputs are sent, whenever a frame is returned (the
        device's draw of its first codes: nothing of the host's between the two)."""
        if not (self.sums_frames and isinstance(cp, DecoderSession)
                and self.draws_in_engine(params)):  # fmt: skip
            return None
        n = len(add)
        saved = [r.bit_generator.state for r in rngs]
        uniform_rows, e0_in = self._staged(self._uniforms(params, rngs), e0)
        drawn, drawn_rows = self._drawn_codes(self.groups - 1, n)
        both, base, added, out = self._sum_buffers(n, dtype)
        if e0 is None:  # E(c0) is where the device's draw wrote it
            self.engine.buffers.upload(added, np.ascontiguousarray(add, np.float32))
        else:
            rows = np.stack([e0, add]).astype(np.float32, copy=False)
            self.engine.buffers.upload(both, np.ascontiguousarray(rows))  # base and add at once
        hidden = self._graphed_frame(cp, last_hidden, e0_in, np.ones(n, np.int32), params,
                                     uniform_rows, drawn_rows, (base, added, drawn, out),
                                     before)  # fmt: skip
        hidden = self.engine.buffers.view(hidden, (n, self.hidden_size))
        reader = self._reader(drawn.shape)  # the codes read right behind the frame
        reader.queue(drawn)
        return QueuedFrame(self, cp, hidden, code0, e0, add, params, list(rngs), saved, reader,
                           out)  # fmt: skip

    def _reader(self, shape: tuple[int, ...]) -> Any:
        """A Buffers.reader for a queued frame's codes [G-1, n], not read behind what is
        queued after the frame. Two a shape, taken in turn: a frame queued ahead
        (SpeechTalker.draw) is queued before the one before it is read, and one reader's
        pinned buffer holds only what it copied last."""
        ring = self._readers.get(shape)
        if ring is None:
            ring = self._readers[shape] = [self.engine.buffers.reader(shape, np.int64)
                                           for _ in range(2)]  # fmt: skip
        ring.reverse()
        return ring[0]

    def _sum_buffers(self, n: int, dtype: Any) -> tuple[Any, Any, Any, Any]:
        """A frame sum's buffers for ``n`` rows, kept per cohort size and type: one [2, n, H]
        float32 buffer (uploaded at once), its two rows as views (the base, E(c0), and the
        added rows), and the output [n, 1, H] in ``dtype``."""
        key = (n, np.dtype(dtype))
        got = self._sums.get(key)
        if got is None:
            memory = self.engine.buffers
            both = memory.zeros((2, n, self.hidden_size), np.float32)
            base, add = (memory.view(memory.rows(both, 1, i), (n, self.hidden_size))
                         for i in range(2))  # fmt: skip
            out = memory.zeros((n, 1, self.hidden_size), dtype)
            got = self._sums[key] = (both, base, add, out)
        return got

    def _queue_frame(
        self, cp: DecoderSession, last_hidden: Any, e0_in: Any, q: np.ndarray,
        draw: dict[str, Any], uniform_rows: list[Any], drawn_rows: list[Any],
        summed: tuple[Any, Any, Any, Any] | None = None,
    ) -> None:  # fmt: skip
        """A frame's calls with the engine drawing, queued: the talker's hidden state alone
        (what that call outputs is not read), then E(c0) (``e0_in`` [n, 1, H]) and each step
        fed the embedding of the code the one before drew, its code copied aside before a later
        call can write it (on a GPU the host waits once, for all of them). ``summed`` (base,
        added rows, drawn codes, out): then the frame's embedding sum too (Engine.sum_frame)."""
        memory = self.engine.buffers
        n = len(q)
        past = np.zeros(n, np.int32)
        cp.run(memory.view(last_hidden, (n, 1, self.hidden_size)), text_positions(past, 1, False),
               past, q, np.zeros(n, np.int64), tag=0, wait=False,
               lm_head_index=np.zeros(1, np.int64), **draw)  # fmt: skip
        past, x = past + 1, e0_in
        for group in range(1, self.groups):
            out = self._step(cp, x, past, q, group,
                             {**draw, "sample_uniform": uniform_rows[group - 1]}, wait=False)  # fmt: skip
            memory.copy_into(drawn_rows[group - 1], out.buffer("sampled_ids"))
            past = past + x.shape[1]
            x = out.buffer("sampled_embeds")
            x = memory.view(x, (n, 1, x.shape[-1]))
        if summed is not None:
            base, add, drawn, embeds = summed
            self.engine.sum_frame(embeds, base, drawn, add)

    def _graphed_frame(
        self, cp: DecoderSession, last_hidden: Any, e0_in: Any, q: np.ndarray,
        params: SamplingParams, uniform_rows: list[Any], drawn_rows: list[Any],
        summed: tuple[Any, Any, Any, Any] | None = None,
        before: Callable[[], None] | None = None,
    ) -> Any:  # fmt: skip
        """``_queue_frame`` as one graph (Engine.sequence_graph), captured at a cohort shape's
        first frame and launched for each: one launch instead of 16 calls and 15 copies, each
        with the host's work around it. Everything the graph reads lives at fixed addresses:
        the staged uniforms and first embeddings, the talker's hidden state (copied into a
        buffer of the frame's, or uploaded there), the draw settings (uploaded when they
        change). Returns the graph's copy of the talker's hidden state (it stays until the
        graph's next launch)."""
        memory = self.engine.buffers
        n = len(q)
        # the prefill's draw is not read: its uniform may be any of the staged rows
        draw = {**self._device_settings(params), "sample_uniform": uniform_rows[0]}
        key = (cp.rows, cp.first_row, n, None if summed is None else summed[3].dtype)
        frame = self._frames.get(key)
        if frame is None or not frame[0].valid():
            dtype = self.engine.input_types.get("inputs_embeds", np.dtype(np.float32))
            hidden = memory.zeros((n, 1, self.hidden_size), dtype)
            graph = self.engine.sequence_graph(lambda: self._queue_frame(
                cp, hidden, e0_in, q, draw, uniform_rows, drawn_rows, summed))  # fmt: skip
            frame = self._frames[key] = (graph, hidden)
        graph, hidden = frame
        # the talker's output buffer (copied on the device), or its rows' states gathered on
        # the host (uploaded in the engine's type)
        memory.copy_into(hidden, memory.view(last_hidden, hidden.shape))
        if before is not None:
            before()
        graph.launch()
        return hidden

    def _device_settings(self, params: SamplingParams) -> dict[str, Any]:
        """The draw settings (temperature, top-k, top-p) in device buffers a frame graph reads,
        uploaded when they differ from the last frame's."""
        host = self._draw_inputs(None, params)
        del host["sample_uniform"]
        memory = self.engine.buffers
        if not self._settings:
            types = self.engine.input_types
            self._settings = {k: memory.zeros(v.shape, types.get(k, v.dtype))
                              for k, v in host.items()}  # fmt: skip
        sent = tuple(float(v[0]) for v in host.values())
        if sent != self._settings_sent:
            for name, value in host.items():
                memory.upload(self._settings[name], value.astype(self._settings[name].dtype))
            self._settings_sent = sent
        return dict(self._settings)

    def first_inputs(self, n: int, dtype: Any) -> tuple[Any, Any]:
        """Where ``queue_frame`` reads a frame's E(c0) when given none (its first codes drawn
        on the device, Engine.draw_first writing both): the first call's input [n, 1, H] and
        the sum's float32 base [n, H] (``dtype``: the talker's input type, the sum's)."""
        return self._staging_buffers(self.groups - 1, n)[1], self._sum_buffers(n, dtype)[1]

    def _staging_buffers(self, steps: int, n: int) -> tuple[Any, Any, list[Any]]:
        """``_staged``'s device buffers, kept per frame shape: the uniform numbers [steps, n]
        float64, the first input [n, 1, H] and a view of each step's numbers."""
        key = (steps, n)
        staged = self._staging.get(key)
        if staged is None:
            memory = self.engine.buffers
            dtype = self.engine.input_types.get("inputs_embeds", np.dtype(np.float32))
            rows = memory.zeros((steps, n), np.float64)
            staged = self._staging[key] = (
                rows,
                memory.zeros((n, 1, self.hidden_size), dtype),
                self._row_views(rows, steps, n),  # made once, not per frame
            )
        return staged

    def _staged(self, uniforms: np.ndarray, e0: np.ndarray | None) -> tuple[list[Any], Any]:
        """A frame's per-step uniform numbers and its first codes' embeddings [n, 1, H], where
        the engine reads them. On a GPU both go up once, before the frame's first call, into
        buffers the steps read device to device (one upload a frame instead of one a step);
        ``e0`` None: the embeddings are there already (``first_inputs``). On a CPU: host
        arrays."""
        steps, n = uniforms.shape
        memory = self.engine.buffers
        if memory.on_host:
            if e0 is None:
                raise ValueError("a CPU engine's frame takes its first codes' embeddings")
            return list(uniforms), e0[:, None, :]
        rows, first, views = self._staging_buffers(steps, n)
        memory.upload(rows, np.ascontiguousarray(uniforms, np.float64))
        if e0 is not None:
            memory.upload(first, np.ascontiguousarray(e0[:, None, :], first.dtype))
        return views, first

    def _row_views(self, buf: Any, steps: int, n: int) -> list[Any]:
        """Each of a [steps, n] buffer's rows, as an [n] view."""
        memory = self.engine.buffers
        return [memory.view(memory.rows(buf, 1, i), (n,)) for i in range(steps)]

    def _drawn_codes(self, steps: int, n: int) -> tuple[Any, list[Any]]:
        """Where a frame's drawn codes [steps, n] gather, and a view of each step's row: the
        engine's memory (on a GPU, one download per frame), kept per cohort size."""
        got = self._drawn.get((steps, n))
        if got is None:
            buf = self.engine.buffers.zeros((steps, n), np.int64)
            got = self._drawn[(steps, n)] = (buf, self._row_views(buf, steps, n))
        return got


def _decided(
    drawn: np.ndarray, code0: np.ndarray, rngs: Sequence[np.random.Generator], saved: list[Any]
) -> np.ndarray | None:
    """A frame's codes [n, G] from its first codes and the engine's draws [G-1, n]; None, each
    generator put back to its ``saved`` state, where the engine could not decide a row (-1)."""
    codes = np.concatenate([code0[:, None], drawn.T], axis=1)
    if (codes >= 0).all():
        return codes
    for r, state in zip(rngs, saved, strict=True):
        r.bit_generator.state = state
    return None


class QueuedFrame:
    """A frame ``CodePredictor.queue_frame`` queued on the device. ``embeds`` [n, 1, H]: its
    summed embedding plus the rows added to it, where the talker's next call reads it (on the
    same stream, so after the frame). ``codes`` reads the drawn codes (``drawn``: a
    Buffers.reader queued right behind the frame, so the host waits for the frame alone, not
    for the talker's step queued after it); a row the engine could not decide
    makes it redraw the whole frame on the host from the same numbers, as ``frame`` would, and
    return that frame's embedding plus the added rows (the talker's call that read ``embeds``
    must then run again on it)."""

    def __init__(
        self, owner: CodePredictor, session: DecoderSession, hidden: Any,
        code0: np.ndarray | None, e0: np.ndarray | None, add: np.ndarray,
        params: SamplingParams, rngs: list[np.random.Generator], saved: list[Any], drawn: Any,
        embeds: Any,
    ) -> None:  # fmt: skip
        self._owner, self._session, self._hidden = owner, session, hidden
        self._code0, self._e0, self._add = code0, e0, add
        self._params, self._rngs, self._saved, self._drawn = params, rngs, saved, drawn
        self.embeds = embeds

    def put_back(self) -> None:
        """Each generator back to its state before the frame took its numbers (a frame that
        goes unused: the numbers are drawn again for the one that replaces it)."""
        for r, state in zip(self._rngs, self._saved, strict=True):
            r.bit_generator.state = state

    def first(self, code0: np.ndarray, e0: np.ndarray) -> None:
        """The first codes the device drew for this frame, and their embeddings, once the host
        has read them (before ``codes``)."""
        self._code0, self._e0 = code0, e0

    def codes(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The frame's codes [n, G], and None, or the host's embedding [n, H] (plus the added
        rows) where the host redrew the frame."""
        if self._code0 is None or self._e0 is None:
            raise RuntimeError("a frame's codes read before its first codes were given")
        owner = self._owner
        codes = _decided(self._drawn.wait(), self._code0, self._rngs, self._saved)
        if codes is not None:
            return codes, None
        codes, embed = owner.host_frame(self._session, self._hidden, self._code0, self._e0,
                                        self._params, self._rngs)  # fmt: skip
        return codes, embed + self._add
