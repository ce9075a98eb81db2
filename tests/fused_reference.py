"""A fused engine's call in numpy: the launch plan the build compiled from the exported graph
(runtime/fused_spec.py's steps), each step run by its kernel's reference (plugins/decoder_cuda.py,
plugins/decoder_linear_cuda.py, plugins/attention.py). It reads the same weight file and config,
so it pins the compiler's plan and layout where no GPU is (tests/test_fused_build.py), and is
what the GPU tests compare the kernels' calls to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.plugins import attention, gated_delta, moe_cuda
from edgeomni.plugins import decoder_cuda as dc
from edgeomni.plugins import decoder_linear_cuda as lc
from edgeomni.plugins import gated_delta_cuda as gdc
from edgeomni.runtime import safetensors_np


class FusedReference:
    def __init__(self, folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        self._take(cfg["fused"], safetensors_np.load(folder / cfg["engine"]))

    @classmethod
    def of(cls, spec: dict[str, Any], tensors: dict[str, np.ndarray]) -> FusedReference:
        """The reference of a plan and weights as builder/fused_plan.py compiled them."""
        ref = cls.__new__(cls)
        ref._take(spec, tensors)
        return ref

    def _take(self, spec: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
        self.spec = spec
        self.w = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                  for k, v in tensors.items()}  # fmt: skip
        group = (self.spec.get("int4") or {}).get("group_size")  # the int4 pass's group
        for name in [k for k in self.w if k + ".scales" in self.w]:  # int4: the matrix it codes
            codes = self.w[name]
            flat = lc.int4_weights(codes.reshape(-1, codes.shape[-1]),
                                   self.w.pop(name + ".scales"), group)  # fmt: skip
            self.w[name] = flat.reshape(*codes.shape[:-1], -1).astype(np.float64)

    def cache(self, rows: int, capacity: int) -> list[np.ndarray]:
        """Each layer's two state tensors, zero: keys and values, or a Gated DeltaNet layer's
        conv state [B, conv channels, K - 1] and recurrent state [B, Hv, dv, dk]."""
        s = self.spec
        shape = (rows, s["num_kv_heads"], capacity, s["head_dim"])
        cache = [np.zeros(shape) for _ in range(2 * s["num_layers"])]
        dims = s.get("delta") or {}
        for step in s["plan"]:
            if step["op"] == "delta_conv":
                n, hk, hv = step["layer"], dims["k_heads"], dims["v_heads"]
                channels = 2 * hk * dims["k_dim"] + hv * dims["v_dim"]
                cache[2 * n] = np.zeros((rows, channels, step["kernel"] - 1))
                cache[2 * n + 1] = np.zeros((rows, hv, dims["v_dim"], dims["k_dim"]))
        return cache

    def run(self, embeds: np.ndarray, positions: np.ndarray, past_lens: np.ndarray,
            query_lens: np.ndarray, last: np.ndarray, cache: list[np.ndarray],
            head: int = 0, draw: dict[str, Any] | None = None,
            deepstack: np.ndarray | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """One call: embeds [B, S, E], positions [B, S] or [3, B, S]; the cache updated in
        place. Runs the plan's steps, each by its kernel's reference; returns logits [B, V]
        and, where configured, hidden_states, last_hidden, topk and (a sampler's build, given
        ``draw``: uniform [B], temperature, top_k, top_p) the draw."""
        s, w = self.spec, self.w
        b, seq = embeds.shape[:2]
        t = b * seq
        eps, d = s["rms_norm_eps"], s["head_dim"]
        pos = positions.reshape(-1 if positions.ndim == 2 else 3, t)
        pos = pos.reshape(1, t) if positions.ndim == 2 else pos
        buf: dict[str, np.ndarray] = {"embeds": embeds.reshape(t, -1).astype(np.float64)}
        out: dict[str, np.ndarray] = {}

        def rows_of(x: np.ndarray) -> np.ndarray:
            return x.reshape(b, seq, -1)[np.arange(b), last]

        for step in s["plan"]:
            op = step["op"]
            if op == "embed" and step["weight"]:
                buf["h"] = lc.linear_reference(buf["embeds"], w[step["weight"]],
                                               bias=w[step["bias"]])  # fmt: skip
            elif op == "embed":
                buf["h"] = buf["embeds"]
            elif op == "linear":
                x = buf[step["x"]]
                weight = w[step["weight"]][head] if step["heads"] else w[step["weight"]]
                norm = w.get(step["norm"]) if step["norm"] else None
                if step["rows"] == "last":
                    x = rows_of(x)
                y = lc.linear_reference(
                    x, weight, norm_w=norm, eps=eps, swiglu=step["swiglu"],
                    bias=w[step["bias"]] if step["bias"] else None,
                    residual=buf["h"] if step["add"] else None,
                )  # fmt: skip
                buf[step["out"]] = y
            elif op == "qk_rope":
                buf["q"], buf["k"], buf["v"] = dc.qk_rope_reference(
                    buf["qkv"], pos, heads=s["num_heads"], kv_heads=s["num_kv_heads"],
                    head_dim=d, inv_freq=w["inv_freq"], q_norm=w.get(step["q_norm"] or ""),
                    k_norm=w.get(step["k_norm"] or ""), eps=eps, freq_axis=w.get("freq_axis"),
                    gated=s.get("attn_gate", False), rotary_dim=s.get("rotary_dim"),
                )  # fmt: skip
            elif op == "attention":
                n = step["layer"]
                o, cache[2 * n], cache[2 * n + 1] = attention.reference(
                    buf["q"].reshape(b, seq, -1), buf["k"].reshape(b, seq, -1),
                    buf["v"].reshape(b, seq, -1), cache[2 * n], cache[2 * n + 1], past_lens,
                    query_lens, num_heads=s["num_heads"], kv_num_heads=s["num_kv_heads"],
                )  # fmt: skip
                buf["attn"] = o.reshape(t, -1)
            elif op in gdc.DELTA_STEPS:
                self._delta(step, buf, cache, b, seq, query_lens)
            elif op == "attn_gate":
                buf["attn"] = dc.attn_gate_reference(buf["attn"], buf["qkv"], s["num_heads"], d)
            elif op == "moe":
                shared = {"shared": buf["shared_out"], "gate": buf["shared_gate"]} \
                    if step["shared"] else {}  # fmt: skip
                buf["h"] = moe_cuda.reference(
                    buf["h"], w[step["norm"]], eps, buf["router"], w[step["fc1"]],
                    w[step["fc2"]], top_k=step["top_k"], normalize=int(step["normalize"]),
                    **shared)  # fmt: skip
            elif op == "deepstack":
                assert deepstack is not None
                buf["h"] = buf["h"] + deepstack[step["index"]].reshape(t, -1)
            elif op == "output":
                out[step["name"]] = buf["h"].reshape(b, seq, -1)
            elif op == "last_hidden":
                rows = rows_of(buf["h"])
                out["last_hidden"] = rows * lc.rms_scale(rows, eps) * w[step["norm"]]
            elif op == "topk":  # a float16 build's top K is of its float16 logits
                logits = buf["logits"]
                if s["dtype"] == "float16":
                    logits = logits.astype(np.float16).astype(np.float64)
                out["topk_values"], out["topk_indices"] = dc.topk_reference(
                    logits, step["k"], w.get(step["bias"] or ""))
                if step["tables"] and draw is not None:
                    out["sampled_ids"], out["sampled_embeds"] = dc.sample_reference(
                        out["topk_values"], out["topk_indices"], draw["uniform"],
                        temperature=draw["temperature"], top_k=draw["top_k"],
                        top_p=draw["top_p"], tables=w[step["tables"]], head=head,
                    )  # fmt: skip
            else:
                raise AssertionError(f"a plan step of no reference: {op}")
        out["logits"] = buf["logits"]
        return out

    def _delta(self, step: dict[str, Any], buf: dict[str, np.ndarray], cache: list[np.ndarray],
               b: int, seq: int, query_lens: np.ndarray) -> None:  # fmt: skip
        """A Gated DeltaNet layer's step (builder/fused_delta.py): its conv of mix's first
        columns into conv, the gates and the rule into attn, attn's per-head norm times
        silu(z)."""
        dims, n, w = self.spec["delta"], step["layer"], self.w
        key, value = dims["k_heads"] * dims["k_dim"], dims["v_heads"] * dims["v_dim"]
        channels = 2 * key + value
        mix = buf["mix"]
        if step["op"] == "delta_conv":
            y, cache[2 * n] = gated_delta.conv_reference(
                mix[:, :channels].reshape(b, seq, channels), w[step["weight"]], cache[2 * n],
                query_lens, kernel_size=step["kernel"],
                activation="silu" if step["silu"] else "none")  # fmt: skip
            buf["conv"] = y.reshape(b * seq, channels)
        elif step["op"] == "delta_rule":
            g, beta = gdc.gates_reference(
                mix, channels + value, dims["v_heads"], w[step["dt_bias"]], w[step["a_neg"]],
                step["softplus_threshold"])  # fmt: skip
            conv = buf["conv"].reshape(b, seq, channels)
            o, cache[2 * n + 1] = gated_delta.rule_reference(
                conv[..., :key], conv[..., key : 2 * key], conv[..., 2 * key :],
                g.reshape(b, seq, -1), beta.reshape(b, seq, -1), cache[2 * n + 1], query_lens,
                num_k_heads=dims["k_heads"], num_v_heads=dims["v_heads"], qk_l2norm=step["l2"],
                scale=step["scale"])  # fmt: skip
            buf["attn"] = o.reshape(b * seq, value)
        else:
            buf["attn"] = gdc.gated_norm_reference(
                buf["attn"], mix[:, channels : channels + value], w[step["weight"]],
                dims["v_dim"], self.spec["rms_norm_eps"])  # fmt: skip
