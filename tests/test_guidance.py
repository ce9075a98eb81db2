"""Classifier-free guidance as two rows per request (runtime/decoder_stage.py): the toy family's
guide stage (tests/toy_family, a tiny random decoder over bytes, built by edge-build) runs
two-row requests beside one-row requests in one in-flight batch, joining and leaving, and every
request's tokens equal a numpy reference of guided sampling: the same weights evaluated in
numpy, ``guided = uncond + scale * (cond - uncond)``, drawn by runtime/sampling.py's ``sample``
with the request's own generator, greedy and seeded. The engine that combines the rows in its
graph (decoder.WithGuidance, with a top-K after it) gives the same tokens as the host's
combination; and the stage's pieces (step plan, prefill runs, host combination with a top-K,
the in-graph inputs) are checked without an engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.decoder_stage import (
    Slot,
    guidance_feeds,
    guide,
    plan_step,
    prefill_runs,
    span_logits,
)
from edgeomni.runtime.safetensors_np import load
from edgeomni.runtime.sampling import SamplingParams, StepLogits, sample, sample_rows

TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
ENV = {  # the toy registered as an out-of-tree family is (tests/test_families.py)
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p),
    "EDGEOMNI_FAMILIES": "toy_family",
}


def tool(name: str) -> str:
    return str(BIN / name) if (BIN / name).exists() else name

BOS = 256
GREEDY = {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
# (prompt, max length, guidance scale or None, negative prompt, sampling)
REQUESTS = [
    ("hello there", 6, None, "", GREEDY),
    ("hello there", 9, 3.0, "", GREEDY),
    ("abc", 4, 1.5, "xyz", {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "seed": 7}),
    ("a longer prompt, one row", 3, None, "", {"temperature": 1.0, "top_k": 5, "top_p": 1.0,
                                               "seed": 3}),  # fmt: skip
    ("guided", 7, 2.0, "dull", {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "seed": 11}),
    ("q", 5, None, "", GREEDY),
    ("zz", 2, 4.0, "", GREEDY),
    ("late", 6, 0.5, "no", {"temperature": 1.2, "top_k": 0, "top_p": 0.8, "seed": 5}),
]


def request_file(path: Path) -> Path:
    reqs = []
    for prompt, n, scale, negative, sampling in REQUESTS:
        r: dict[str, Any] = {"prompt": prompt, "max_generate_length": n, "sampling": sampling}
        if scale is not None:
            r["guidance_scale"] = scale
            if negative:
                r["negative_prompt"] = negative
        reqs.append(r)
    path.write_text(json.dumps({"requests": reqs}))
    return path


@pytest.fixture(scope="module")
def guide_engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy's checkpoint with its guide decoder, built twice by edge-build (at once): the
    host combines guided rows ("host", no top-K in the engine), and the engine does, with a
    top-K of 8 after it ("graph")."""
    root = tmp_path_factory.mktemp("guide")
    make = ("from toy_family.tiny import make; import sys; "
            "make(sys.argv[1], guide=True, guide_in_graph=sys.argv[2] == '1')")  # fmt: skip
    builds = {}
    for name, in_graph, topk in (("host", "0", "0"), ("graph", "1", "8")):
        ckpt = root / f"{name}-ckpt"
        made = subprocess.run([sys.executable, "-c", make, str(ckpt), in_graph], env=ENV,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert made.returncode == 0, made.stderr
        builds[name] = subprocess.Popen(
            [tool("edge-build"), "--model-dir", str(ckpt), "--engine-dir", str(root / name),
             "--max-batch-size", "4", "--max-input-len", "64", "--max-kv-cache-capacity", "96",
             "--logits-topk", topk],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    for proc in builds.values():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    return {name: root / name for name in builds}


def run_requests(engine: Path, tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / f"{engine.name}-out.json"
    done = subprocess.run(
        [tool("edge-infer"), "--config", str(engine), "--input-file",
         str(request_file(tmp_path / "requests.json")), "--output-file", str(out),
         "--batch-size", "4"],
        env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [r["stages"]["guide"] for r in json.loads(out.read_text())["responses"]]


# -- the numpy reference -------------------------------------------------------------------------
class Reference:
    """The guide decoder's forward pass over a whole sequence, in numpy (float64), from the
    checkpoint's weights (Hugging Face's Qwen3 names)."""

    def __init__(self, ckpt: Path) -> None:
        self.cfg = json.loads((ckpt / "config.json").read_text())["guide"]
        self.w = {k[len("guide."):]: v.astype(np.float64)
                  for k, v in load(ckpt / "model.safetensors").items() if k.startswith("guide.")}

    def rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        eps = self.cfg["rms_norm_eps"]
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def logits(self, ids: list[int]) -> np.ndarray:
        """The last position's logits [V]."""
        c, w = self.cfg, self.w
        d, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        s = len(ids)
        x = w["model.embed_tokens.weight"][ids]
        freqs = np.arange(s)[:, None] / c["rope_theta"] ** (np.arange(0, d, 2) / d)
        cos, sin = np.cos(np.concatenate([freqs, freqs], -1)), np.sin(np.concatenate([freqs, freqs], -1))

        def rope(t: np.ndarray) -> np.ndarray:  # [S, heads, d]
            half = np.concatenate([-t[..., d // 2 :], t[..., : d // 2]], -1)
            return t * cos[:, None] + half * sin[:, None]

        mask = np.triu(np.full((s, s), -np.inf), 1)
        for n in range(c["num_hidden_layers"]):
            p = f"model.layers.{n}."
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(s, nh, d)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(s, nkv, d)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(s, nkv, d)
            q = rope(self.rms(q, w[p + "self_attn.q_norm.weight"]))
            k = rope(self.rms(k, w[p + "self_attn.k_norm.weight"]))
            out = np.empty((s, nh, d))
            for head in range(nh):
                kv = head // (nh // nkv)
                scores = q[:, head] @ k[:, kv].T / np.sqrt(d) + mask
                probs = np.exp(scores - scores.max(-1, keepdims=True))
                out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
            x = x + out.reshape(s, nh * d) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        return self.rms(x[-1], w["model.norm.weight"]) @ w["lm_head.weight"].T

    def generate(self, prompt: str, n: int, scale: float | None, negative: str,
                 sampling: dict[str, Any]) -> list[int]:  # fmt: skip
        """One request alone: each token drawn from the guided logits (cond's alone without a
        scale) by runtime/sampling.py's ``sample``, appended to both rows."""
        params = SamplingParams(**sampling)
        rng = np.random.default_rng(params.seed)
        cond, uncond = [BOS, *prompt.encode()], [BOS, *negative.encode()]
        out: list[int] = []
        while len(out) < n:
            logits = self.logits(cond + out)
            if scale is not None:
                u = self.logits(uncond + out)
                logits = u + scale * (logits - u)
            out.append(int(sample(logits[None].astype(np.float32), params, rng)[0]))
        return out


def test_two_row_requests_beside_one_row_requests_equal_the_numpy_reference(
    guide_engines: dict[str, Path], tmp_path: Path
) -> None:
    """Eight requests, four of them guided (two rows each, prompts of different lengths), in
    four rows: they join as rows free up and leave at their own lengths; each one's tokens are
    the reference's, greedy and seeded, whether the host or the engine combines the rows."""
    ckpt = guide_engines["host"].parent / "host-ckpt"
    ref = Reference(ckpt)
    want = [ref.generate(*r) for r in REQUESTS]
    for name, engine in guide_engines.items():
        got = run_requests(engine, tmp_path)
        assert [g["output_tokens"] for g in got] == want, name
        assert [g["rows"] for g in got] == [1 if r[2] is None else 2 for r in REQUESTS]
        assert max(g["cohort_size"] for g in got if g["rows"] == 2) >= 2  # beside others
        # the host fetched a guided request's two rows each token; the engine's top-K sufficed
        host = name == "host"
        assert all((g["full_logit_rows"] >= 2 * len(g["output_tokens"])) == host
                   for g in got if g["rows"] == 2), name  # fmt: skip


# -- the stage's pieces, without an engine --------------------------------------------------------
def slot(row: int, past: int, lengths: tuple[int, ...] = (), guidance: float | None = None) -> Slot:
    s = Slot(SimpleNamespace(index=row), row, None, None, None, length=past, lengths=lengths)  # type: ignore[arg-type]
    s.guidance = guidance
    return s


def test_a_step_plan_steps_every_row_of_a_span_at_its_own_length() -> None:
    slots = {0: slot(0, 7), 1: slot(1, 5, (5, 2), 3.0), 3: slot(3, 4)}
    for s in slots.values():
        s.past += 2  # two tokens decoded: both rows of the span advanced with it
    plan = plan_step(slots, lambda s: s.row != 3)
    assert plan is not None
    assert plan.rows == (0, 1, 2) and plan.slots == (0, 1) and plan.width == 4
    np.testing.assert_array_equal(plan.past, [9, 7, 4, 6])
    np.testing.assert_array_equal(plan.query, [1, 1, 1, 0])
    runs = prefill_runs([slot(0, 3), slot(1, 3, (3, 1), 2.0), slot(3, 2), slot(5, 2, (2, 2), 1.0)])
    assert [[s.row for s in run] for run in runs] == [[0, 1, 3], [5]]


def test_the_in_graph_inputs_pair_each_guided_row_with_the_next() -> None:
    feeds = guidance_feeds([slot(1, 3, (3, 1), 2.5), slot(3, 2), slot(4, 1, (1, 1), 1.5)], 1, 5)
    np.testing.assert_array_equal(feeds["guidance_rows"], [1, 1, 2, 4, 4])
    np.testing.assert_array_equal(feeds["guidance_scale"], [2.5, 1, 1, 1.5, 1])


def test_the_host_combination_draws_as_the_full_guided_logits_do() -> None:
    """A one-row slot beside a guided span, with an engine top-K of 8: the span's own top-K is
    taken from its guided row, and every draw (greedy, top-k 5, full vocabulary) equals drawing
    from the full guided logits."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 40)).astype(np.float32) * 3
    top = np.argsort(-logits, axis=1, kind="stable")[:, :8]
    step = StepLogits(4, lambda r: logits[np.asarray(r)], np.take_along_axis(logits, top, 1), top)
    slots = [slot(1, 2), slot(2, 3, (3, 2), 2.0)]
    per = span_logits(step, slots, 0, on_host=True)
    full = np.stack([logits[1], guide(logits[2], logits[3], 2.0)])
    np.testing.assert_array_equal(per.full(np.array([0, 1])), full)
    np.testing.assert_array_equal(per.topk_indices[1], np.argsort(-full[1], kind="stable")[:8])
    for params in (SamplingParams(top_k=1), SamplingParams(top_k=5, top_p=1.0, seed=1),
                   SamplingParams(top_k=0, top_p=1.0, seed=2)):  # fmt: skip
        for seed in range(5):
            gens = [np.random.default_rng(seed), np.random.default_rng(seed + 100)]
            got, _ = sample_rows(per, [params] * 2, gens)
            want = [sample(full[j : j + 1], params, np.random.default_rng(s))[0]
                    for j, s in enumerate((seed, seed + 100))]  # fmt: skip
            assert got.tolist() == want
