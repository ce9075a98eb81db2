"""A fused engine's config (config.json's ``fused`` table), checked: the decoder's dimensions,
the ONNX build's inputs and outputs it keeps, and the launch plan builder/fused_plan.py compiled
from the exported graph, which the engine (runtime/fused_engine.py) runs step by step.

A plan is a list of steps, each one kernel family's launch with its options:
- ``embed``: the residual stream h from inputs_embeds (copied, cast, or ``weight`` x + ``bias``)
- ``linear``: ``out`` = ``x`` @ ``weight``^T, with an input RMS ``norm``, a ``bias``, ``swiglu``,
  ``add`` (a residual store), over every position or (``rows`` "last") each row's last one,
  ``heads`` picking one of stacked weights by lm_head_index; x is h, attn or act, out qkv, h,
  act or logits; ``n`` counts the weight's rows (a SwiGLU's gate and up rows: twice its
  output's width)
- ``qk_rope``: qkv's q and k normed (``q_norm``, ``k_norm``) and rotated
- ``attention``: cached attention of ``layer``'s past_key/past_value
- ``moe``: edgeomni::MoE (plugins/moe_cuda.py) of h normed by ``norm``, routed by the
  ``router`` buffer a ``linear`` wrote, ``top_k`` of ``experts`` SwiGLU experts (``fc1`` [E, 2I,
  H], gate and up rows interleaved; ``fc2`` [E, H, I]; int4 experts as the int4 linears: codes
  [E, rows, K / 2] and ``<name>.scales``), the weighted sum added into h, with
  ``shared`` plus sigmoid(``shared_gate``) * ``shared_out`` (buffers ``linear`` steps wrote: a
  shared expert's output and its gate's logit)
- ``deepstack``: deepstack_embeds[``index``] added into h
- ``output``: h into hidden_states; ``last_hidden``: each row's last h, normed by ``norm``
- ``topk``: the logits' top ``k`` (plus a ``bias``), and with ``tables`` each row's draw and its
  embedding
- Qwen3.5 (builder/fused_delta.py): ``attn_gate`` (the attention's output times sigmoid of
  the gates beside q in qkv);
  a Gated DeltaNet ``layer``'s ``delta_conv`` (the conv of the ``mix`` buffer's first columns,
  ``weight`` [C, ``kernel``], its conv state in place), ``delta_rule`` (the gates from mix's
  last columns with ``dt_bias``, ``a_neg``, ``softplus_threshold``; the rule, its recurrent
  state in place) and ``gated_norm`` (the rule's output per head normed by ``weight`` times
  silu(z))
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.graph_schema.state import StateTensor, kv_tensors
from edgeomni.plugins.gated_delta_cuda import DELTA_STEPS
from edgeomni.runtime.engine_api import EngineError

# the float types a build writes its weights and cache in
DTYPES = ("float16", "float32")
# export/common/sampler.py's names (that module needs torch; the runtime does not)
SAMPLER_INPUTS = ("sample_uniform", "sample_temperature", "sample_top_k", "sample_top_p")
SAMPLER_OUTPUTS = ("sampled_ids", "sampled_embeds")
# each step's fields and the values they take (str: a weight name or None)
STEPS: dict[str, dict[str, Any]] = {
    "embed": {"weight": str, "bias": str},
    "linear": {"x": ("h", "attn", "act"), "out": ("qkv", "h", "act", "logits", "router", "shared_out", "shared_gate", "mix"), "k": int,
               "n": int, "weight": str, "norm": str, "bias": str, "add": bool, "swiglu": bool,
               "rows": ("all", "last"), "heads": bool},  # fmt: skip
    "qk_rope": {"q_norm": str, "k_norm": str},
    "attention": {"layer": int},
    "moe": {"norm": str, "fc1": str, "fc2": str, "experts": int, "top_k": int,
            "intermediate": int, "normalize": bool, "shared": bool},
    "deepstack": {"index": int},
    "output": {"name": ("hidden_states",)},
    "last_hidden": {"norm": str},
    "topk": {"k": int, "bias": str, "tables": str},
    "attn_gate": {},
    "delta_conv": {"layer": int, "weight": str, "kernel": int, "silu": bool},
    "delta_rule": {"layer": int, "dt_bias": str, "a_neg": str, "l2": int, "scale": float},
    "gated_norm": {"layer": int, "weight": str},
}
DELTA_DIMS = ("k_heads", "v_heads", "k_dim", "v_dim", "conv_kernel")


class FusedSpec:
    """config.json's ``fused`` table: the decoder's dimensions, options and plan, checked."""

    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        def need(key: str) -> int:
            if not isinstance(table.get(key), int) or table[key] <= 0:
                raise EngineError(f"{where}: fused.{key} must be a positive integer")
            return int(table[key])

        self.where = where
        self.hidden = need("hidden_size")
        self.layers = need("num_layers")
        self.heads = need("num_heads")
        self.kv_heads = need("num_kv_heads")
        self.head_dim = need("head_dim")
        self.intermediate = need("intermediate_size")
        self.vocab = need("vocab_size")
        self.eps = float(table.get("rms_norm_eps", 1e-6))
        self.dtype = str(table.get("dtype", "float16"))
        if self.dtype not in DTYPES:
            raise EngineError(f"{where}: fused.dtype {self.dtype!r} is not one of {DTYPES}")
        self.input_size = int(table.get("input_size") or 0)
        self.lm_heads = int(table.get("lm_heads") or 1)
        self.mrope = bool(table.get("mrope"))
        # Qwen3.5's attention: q beside its output gate; rotary of each head's first dims
        self.attn_gate = bool(table.get("attn_gate"))
        self.rotary_dim = int(table.get("rotary_dim") or self.head_dim)
        delta = table.get("delta")  # its Gated DeltaNet layers' dimensions
        if delta is not None and not (isinstance(delta, Mapping) and all(
                isinstance(delta.get(k), int) and delta[k] > 0 for k in DELTA_DIMS)):  # fmt: skip
            raise EngineError(f"{where}: fused.delta must give {', '.join(DELTA_DIMS)}")
        self.delta = dict(delta) if delta is not None else None
        hidden_layer = table.get("hidden_output_layer")
        self.hidden_output_layer = None if hidden_layer is None else int(hidden_layer)
        self.last_hidden = bool(table.get("last_hidden_output"))
        self.deepstack_layers = int(table.get("deepstack_layers") or 0)
        self.topk = int(table.get("logits_topk") or 0)
        self.embeds_dtype = str(table.get("embeds_dtype", "float32"))
        if self.embeds_dtype not in DTYPES:
            raise EngineError(f"{where}: fused.embeds_dtype {self.embeds_dtype!r} is not one of "
                              f"{DTYPES}")  # fmt: skip
        # draws each row's next id from its top-K and outputs its embedding
        # (export/common/sampler.py's inputs and outputs)
        self.sampler = bool(table.get("sampler"))
        if self.sampler and (self.topk < 2 or self.embeds_dtype != self.dtype):
            raise EngineError(f"{where}: an in-engine sampler needs logits_topk >= 2 and "
                              "embeds_dtype equal to dtype (its embeddings feed the next call)")
        vec = 8 if self.dtype == "float16" else 4
        widths = {"hidden_size": self.hidden, "intermediate_size": self.intermediate,
                  "num_heads * head_dim": self.heads * self.head_dim}  # fmt: skip
        if self.input_size:
            widths["input_size"] = self.input_size
        for name, n in widths.items():
            if n % vec:
                raise EngineError(f"{where}: {name} {n} is not a multiple of {vec}, as the "
                                  "fused kernels read weight rows 16 bytes at a time")  # fmt: skip
        if self.head_dim > 512 or self.head_dim % 2:
            raise EngineError(f"{where}: head_dim {self.head_dim} must be even and at most 512")
        # int4 matrices (the build's one int4 pass, builder/quantize.py): codes [rows, K / 2]
        # under the matrix's name, one float16 scale a row and group of K under
        # ``<name>.scales``; which matrices are int4 the weight file says
        int4 = table.get("int4")
        self.int4_group = 0
        if int4 is not None:
            group = int4.get("group_size") if isinstance(int4, Mapping) else None
            if self.dtype != "float16" or group not in (32, 64, 128):
                raise EngineError(f"{where}: fused.int4 needs dtype float16 and a group_size of "
                                  "32, 64 or 128")  # fmt: skip
            self.int4_group = int(group)
        self.plan = self._check_plan(table.get("plan"), where)
        # the MoE steps' largest experts, top-k and intermediate size (the binding's scratch)
        moe = [s for s in self.plan if s["op"] == "moe"]
        self.moe = tuple(max(s[k] for s in moe) for k in ("experts", "top_k", "intermediate")) \
            if moe else None  # fmt: skip
        for s in moe:
            if not 1 <= s["top_k"] <= min(s["experts"], 32):
                raise EngineError(f"{where}: a MoE step takes the top {s['top_k']} of "
                                  f"{s['experts']} experts (1 to 32)")  # fmt: skip

    @property
    def qkv_width(self) -> int:
        """The qkv product's columns: q (each head beside its output gate where gated), k, v."""
        return ((2 if self.attn_gate else 1) * self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def conv_channels(self) -> int:
        """A Gated DeltaNet layer's conv channels: its q, k and v side by side."""
        d = self.delta or {}
        return 2 * d.get("k_heads", 0) * d.get("k_dim", 0) + d.get("v_heads", 0) * d.get("v_dim", 0)

    @property
    def mix_width(self) -> int:
        """A Gated DeltaNet layer's in_proj columns: the conv's channels, z, beta's and the
        decay's inputs."""
        d = self.delta or {}
        return self.conv_channels + d.get("v_heads", 0) * (d.get("v_dim", 0) + 2)

    def _check_plan(self, plan: Any, where: str) -> tuple[dict[str, Any], ...]:
        """Each step of a known kernel family with the fields it takes; the layers' attention
        in order, the logits written once and last but for the top-K."""
        if not isinstance(plan, list) or not plan:
            raise EngineError(f"{where}: fused.plan must be a list of steps (rebuild the engine "
                              "with this edgeomni's edge-build)")  # fmt: skip
        for i, step in enumerate(plan):
            at = f"{where}: fused.plan[{i}]"
            fields = STEPS.get(step.get("op")) if isinstance(step, Mapping) else None
            if fields is None:
                raise EngineError(f"{at} is not a step of {', '.join(STEPS)}")
            for key, kind in fields.items():
                value = step.get(key)
                ok = (value is None or isinstance(value, str)) if kind is str else (
                    isinstance(value, kind) if isinstance(kind, type) else value in kind)
                if not ok:
                    raise EngineError(f"{at}.{key} is {value!r}")
        ops = [s["op"] for s in plan]
        paired = all(ops[i + 1 : i + 2] == ["attention"] for i, o in enumerate(ops) if o == "qk_rope")
        if not paired or ops.count("qk_rope") != ops.count("attention"):
            raise EngineError(f"{where}: fused.plan must run each attention step right after "
                              "its qk_rope step")  # fmt: skip
        layers = [s["layer"] for s in plan if s["op"] in ("attention", "delta_rule")]
        if layers != list(range(self.layers)):
            raise EngineError(f"{where}: fused.plan's layers are {layers}, not 0 to "
                              f"{self.layers - 1}")  # fmt: skip
        delta = [ops.count(op) for op in DELTA_STEPS]
        if len(set(delta)) != 1 or (delta[0] > 0) != (self.delta is not None):
            raise EngineError(f"{where}: fused.plan's Gated DeltaNet layers need a delta_conv, a "
                              "delta_rule and a gated_norm each, and fused.delta")  # fmt: skip
        for i, s in enumerate(plan):
            threshold = s.get("softplus_threshold")
            if s["op"] == "delta_rule" and not (threshold is None or isinstance(
                    threshold, int | float)):  # fmt: skip
                raise EngineError(f"{where}: fused.plan[{i}].softplus_threshold is {threshold!r}")
        logits = [i for i, s in enumerate(plan) if s["op"] == "linear" and s["out"] == "logits"]
        tail = [s["op"] for s in plan[logits[-1] + 1:]] if logits else []
        if len(logits) != 1 or set(tail) - {"topk", "last_hidden"} or (
                tail.count("topk") != (1 if self.topk else 0)):  # fmt: skip
            raise EngineError(f"{where}: fused.plan must write the logits once, after which "
                              "only the top-K and last_hidden")  # fmt: skip
        if plan[0]["op"] != "embed":
            raise EngineError(f"{where}: fused.plan must start with embed")
        return tuple(dict(s) for s in plan)

    def weights(self, int4: set[str]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The shape and type of every weight the plan names (``int4``: the matrices stored as
        codes and scales)."""
        w, f4 = np.dtype(self.dtype), np.dtype(np.float32)
        want: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

        def put(name: str | None, shape: tuple[int, ...], dtype: np.dtype) -> None:
            if name is None:
                return
            if name in want and want[name] != (shape, dtype):
                raise EngineError(f"{self.where}: the plan uses {name} as {want[name][0]} and "
                                  f"as {shape}")  # fmt: skip
            want[name] = (shape, dtype)

        for step in self.plan:
            op = step["op"]
            if op == "linear":
                k, n = step["k"], step["n"]
                shape = (self.lm_heads, n, k) if step["heads"] else (n, k)
                if step["weight"] in int4:
                    put(step["weight"], (*shape[:-1], k // 2), np.dtype(np.uint8))
                    put(step["weight"] + ".scales", (*shape[:-1], k // self.int4_group),
                        np.dtype(np.float16))  # fmt: skip
                else:
                    put(step["weight"], shape, w)
                put(step["norm"], (k,), f4)
                put(step["bias"], (n,), f4)
            elif op == "embed" and step["weight"] is not None:
                put(step["weight"], (self.hidden, self.input_size), w)
                put(step["bias"], (self.hidden,), f4)
            elif op == "moe":  # experts [E, rows, K]: float, or int4 codes and scales
                e, i = step["experts"], step["intermediate"]
                for fc, rows, k in (("fc1", 2 * i, self.hidden), ("fc2", self.hidden, i)):
                    if step[fc] in int4:
                        put(step[fc], (e, rows, k // 2), np.dtype(np.uint8))
                        put(step[fc] + ".scales", (e, rows, k // self.int4_group),
                            np.dtype(np.float16))  # fmt: skip
                    else:
                        put(step[fc], (e, rows, k), w)
                put(step["norm"], (self.hidden,), f4)
            elif op == "qk_rope":
                put(step["q_norm"], (self.head_dim,), f4)
                put(step["k_norm"], (self.head_dim,), f4)
            elif op == "last_hidden":
                put(step["norm"], (self.hidden,), f4)
            elif op == "delta_conv" and self.delta:
                put(step["weight"], (self.conv_channels, step["kernel"]), w)
            elif op == "delta_rule" and self.delta:
                put(step["dt_bias"], (self.delta["v_heads"],), f4)
                put(step["a_neg"], (self.delta["v_heads"],), f4)
            elif op == "gated_norm" and self.delta:
                put(step["weight"], (self.delta["v_dim"],), f4)
            elif op == "topk":
                put(step["bias"], (self.vocab,), f4)
                width = self.input_size or self.hidden
                put(step["tables"], (self.lm_heads, self.vocab, width), w)
        put("inv_freq", (self.rotary_dim // 2,), f4)
        if self.mrope:
            put("freq_axis", (self.rotary_dim // 2,), np.dtype(np.int32))
        return want

    def check_weights(self, path: Path, tensors: Mapping[str, np.ndarray]) -> None:
        """Every weight the plan names, of its shape and type, and nothing else."""
        int4 = {n for n in tensors if n + ".scales" in tensors}
        if int4 and not self.int4_group:
            raise EngineError(f"{path} holds int4 matrices ({sorted(int4)[0]}, ...) but the "
                              "config has no fused.int4")  # fmt: skip
        want = self.weights(int4)
        for name, (shape, dtype) in want.items():
            got = tensors.get(name)
            if got is None:
                raise EngineError(f"{path} has no tensor {name!r}")
            if got.shape != shape or got.dtype != dtype:
                raise EngineError(f"{path}: {name} is {got.shape} {got.dtype}, the plan "
                                  f"says {shape} {dtype}")  # fmt: skip
        extra = sorted(set(tensors) - set(want))
        if extra:
            raise EngineError(f"{path} holds tensors the plan does not use: "
                              f"{', '.join(extra[:4])}")  # fmt: skip


def names(spec: FusedSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ONNX build's input and output names (export/common/decoder.py, CausalLM.io_names)."""
    inputs = ["inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices"]
    if spec.lm_heads > 1:
        inputs.append("lm_head_index")
    if spec.sampler:
        inputs += SAMPLER_INPUTS
    if spec.deepstack_layers:
        inputs.append("deepstack_embeds")
    outputs = ["logits"]
    if spec.topk:
        outputs += ["topk_values", "topk_indices"]
    if spec.sampler:
        outputs += SAMPLER_OUTPUTS
    if spec.hidden_output_layer is not None:
        outputs.append("hidden_states")
    if spec.last_hidden:
        outputs.append("last_hidden")
    state = state_tensors(spec)
    return tuple(inputs + [t.input for t in state]), tuple(outputs + [t.output for t in state])


def state_tensors(spec: FusedSpec) -> list[StateTensor]:
    """Its row state as the ONNX build of the same decoder declares it, layer by layer: an
    attention layer's keys and values; a Gated DeltaNet layer's conv columns (the cache's type)
    and recurrent state (float32), as the exported Qwen3.5 model declares them."""
    dtype = np.dtype(spec.dtype).name
    delta = {s["layer"]: s for s in spec.plan if s["op"] == "delta_conv"}
    out: list[StateTensor] = []
    for i in range(spec.layers):
        if i not in delta or spec.delta is None:
            out += kv_tensors(1, spec.kv_heads, spec.head_dim, dtype, ids=(i,))
            continue
        d = spec.delta
        out += [StateTensor(f"conv_{i}", "conv", f"past_conv_{i}", f"present_conv_{i}",
                            (spec.conv_channels, delta[i]["kernel"] - 1), dtype, ("query_lens",)),
                StateTensor(f"recurrent_{i}", "recurrent", f"past_recurrent_{i}",
                            f"present_recurrent_{i}", (d["v_heads"], d["v_dim"], d["k_dim"]),
                            "float32", ("query_lens",))]  # fmt: skip
    return out


def io_types(
    spec: FusedSpec,
) -> tuple[dict[str, np.dtype], dict[str, np.dtype], dict[str, tuple[Any, ...]]]:
    """The ONNX build's input types, output types and output shapes: float inputs in
    ``embeds_dtype``, float outputs and the cache in ``dtype``, the lengths and indices as
    export/common/decoder.py declares them."""
    inputs, outputs = names(spec)
    floats, kv = np.dtype(spec.embeds_dtype), np.dtype(spec.dtype)
    ints = {"position_ids": np.dtype(np.int64), "past_lens": np.dtype(np.int32),
            "query_lens": np.dtype(np.int32), "last_indices": np.dtype(np.int64),
            "lm_head_index": np.dtype(np.int64), "topk_indices": np.dtype(np.int64),
            "sample_uniform": np.dtype(np.float64), "sample_temperature": np.dtype(np.float64),
            "sample_top_k": np.dtype(np.int64), "sample_top_p": np.dtype(np.float64),
            "sampled_ids": np.dtype(np.int64)}  # fmt: skip
    # each state tensor's input and output: its type, and its shape with the rows first
    state = {n: t for t in state_tensors(spec) for n in (t.input, t.output)}
    shapes: dict[str, tuple[Any, ...]] = {
        "logits": ("batch", spec.vocab), "topk_values": ("batch", spec.topk),
        "topk_indices": ("batch", spec.topk), "hidden_states": ("batch", "seq", spec.hidden),
        "last_hidden": ("batch", spec.hidden), "sampled_ids": ("batch",),
        "sampled_embeds": ("batch", spec.input_size or spec.hidden),
    }  # fmt: skip

    def kind(name: str, default: np.dtype) -> np.dtype:
        return np.dtype(state[name].dtype) if name in state else ints.get(name, default)

    return ({n: kind(n, floats) for n in inputs}, {n: kind(n, kv) for n in outputs},
            {n: ("batch", *state[n].shape) if n in state else shapes[n] for n in outputs})
