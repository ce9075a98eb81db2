"""The fused engine's launches for Qwen3.5's plan steps (runtime/fused_spec.py: ``attn_gate``,
``delta_conv``, ``delta_rule``, ``gated_norm``; kernels in plugins/gated_delta_cuda.py), mixed
into runtime/fused_engine.py's per-call launcher. A Gated DeltaNet layer's in_proj product is
the ``mix`` buffer; the conv writes ``conv`` (q, k and v side by side), the rule ``delta``
(float32), the norm the attention buffer the o-projection reads. Each layer's conv and
recurrent states are the bound row state, updated in place.

A Qwen3.5 engine's calls equal the plan's reference on an H100, float32 and float16
(tests/test_fused_gpu.py; docs/gpu-runs/2026-12-06-i55-lease5/)."""

from __future__ import annotations

from typing import Any


class StateSteps:
    """Mixed into fused_engine._Launches, whose attributes these read: spec, p (scratch
    pointers), a (bound arrays' pointers), b, s, tokens, w() and launch()."""

    def attn_gate(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import gated_delta_cuda as gdc
        from edgeomni.plugins.decoder_cuda import i32, ptr

        spec = self.spec
        grid, block = gdc.gate_launch(self.tokens, spec.heads, spec.head_dim)
        self.launch("attn_gate", grid, block, [ptr(self.p["attn"]), ptr(self.p["qkv"]),
                    i32(spec.qkv_width), i32(self.tokens), i32(spec.heads),
                    i32(spec.head_dim)])  # fmt: skip

    def delta_conv(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import gated_delta_cuda as gdc
        from edgeomni.plugins.decoder_cuda import i32, ptr

        spec, n, c = self.spec, step["layer"], self.spec.conv_channels
        grid, block = gdc.conv_launch(self.b, c, step["kernel"])
        self.launch("conv_state", grid, block,
                    [ptr(self.p["mix"]), ptr(self.w(step["weight"])),
                     ptr(self.a[f"past_conv_{n}"]), ptr(self.a["query_lens"]), i32(self.s),
                     i32(c), i32(spec.mix_width), i32(step["kernel"]), i32(int(step["silu"])),
                     ptr(self.p["conv"])])  # fmt: skip

    def delta_rule(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import gated_delta_cuda as gdc
        from edgeomni.plugins.decoder_cuda import f32, i32, ptr

        spec, d, n = self.spec, self.spec.delta, step["layer"]
        c, value = spec.conv_channels, d["v_heads"] * d["v_dim"]
        grid, block = gdc.rule_launch(self.b, d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"])
        self.launch("delta_rule", grid, block,
                    [ptr(self.p["conv"]), i32(c), ptr(self.p["mix"]), i32(spec.mix_width),
                     i32(c + value), ptr(self.w(step["dt_bias"])), ptr(self.w(step["a_neg"])),
                     f32(gdc.rule_threshold(step.get("softplus_threshold"))),
                     ptr(self.a[f"past_recurrent_{n}"]), ptr(self.a["query_lens"]), i32(self.s),
                     i32(d["k_heads"]), i32(d["v_heads"]), i32(d["k_dim"]), i32(d["v_dim"]),
                     i32(step["l2"]), f32(gdc.rule_scale(step["scale"], d["k_dim"])),
                     ptr(self.p["delta"])])  # fmt: skip

    def gated_norm(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import gated_delta_cuda as gdc
        from edgeomni.plugins.decoder_cuda import f32, i32, ptr

        spec, d = self.spec, self.spec.delta
        grid, block = gdc.norm_launch(self.tokens, d["v_heads"], d["v_dim"])
        self.launch("gated_norm", grid, block,
                    [ptr(self.p["delta"]), ptr(self.p["mix"]), i32(spec.mix_width),
                     i32(spec.conv_channels), ptr(self.w(step["weight"])), f32(spec.eps),
                     i32(self.tokens), i32(d["v_heads"]), i32(d["v_dim"]),
                     ptr(self.p["attn"])])  # fmt: skip
