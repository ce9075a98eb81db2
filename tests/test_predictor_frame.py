"""The code predictor's frame engine (export/common/predictor_frame.py): its in-graph draw over
the full vocabulary is the host sampler's (runtime/sampling.py), draw for draw, for every
setting, ties included; the int4 pass covers its heads (or leaves them float when asked)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from edgeomni.export.common.onnx_export import export_onnx  # noqa: E402
from edgeomni.export.common.predictor_frame import draw  # noqa: E402
from edgeomni.runtime.sampling import SamplingParams, sample  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sampling_cases import SETTINGS, Fixed, settings_id  # noqa: E402

VOCAB = 300
# the top-K sampler's settings, and what only a full-vocabulary draw can do
FRAME_SETTINGS = [
    *SETTINGS,
    SamplingParams(temperature=0.8, top_k=0, top_p=0.9),  # top-p alone: the canonical walk
    SamplingParams(temperature=1.1, top_k=0, top_p=1.0),  # neither: the walk is in id order
    SamplingParams(temperature=0.7, top_k=VOCAB, top_p=1.0),  # k = V is no top-k
    SamplingParams(temperature=1.0, top_k=VOCAB + 5, top_p=0.5),
    SamplingParams(temperature=1.0, top_k=200, top_p=1.0),
]


class _Draw(torch.nn.Module):
    def forward(self, logits, uniform, temperature, top_k, top_p):  # noqa: ANN001, ANN201
        return draw(logits, uniform, temperature, top_k, top_p)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    from torch.export import Dim

    f64 = torch.float64
    args = (torch.zeros(2, VOCAB), torch.zeros(2, dtype=f64), torch.ones(1, dtype=f64),
            torch.full((1,), 2, dtype=torch.int64), torch.ones(1, dtype=f64))  # fmt: skip
    batch = Dim("batch")
    path = export_onnx(
        _Draw(), args, Path(tmp_path_factory.mktemp("frame-draw")) / "draw.onnx",
        input_names=["logits", "uniform", "temperature", "top_k", "top_p"],
        output_names=["ids"], dynamic_shapes=({0: batch}, {0: batch}, None, None, None),
    )  # fmt: skip
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("params", FRAME_SETTINGS, ids=settings_id)
def test_the_frame_draws_what_the_host_draws(
    session: ort.InferenceSession, params: SamplingParams
) -> None:
    """Float16-rounded logits (equal values are common) with forced ties at the best value:
    every row's id equals ``sample``'s from the same uniform number (greedy: the lowest id among
    the best, as argmax)."""
    gen = np.random.default_rng(5)
    greedy = params.greedy
    ties = 0
    for trial in range(20):
        logits = (gen.standard_normal((16, VOCAB)) * 2).astype(np.float16).astype(np.float32)
        logits[trial % 16, gen.choice(VOCAB, 5, replace=False)] = logits[trial % 16].max()
        u = gen.random(16)
        got = session.run(None, {
            "logits": logits, "uniform": np.zeros(16) if greedy else u,
            "temperature": np.array([1.0 if greedy else params.temperature]),
            "top_k": np.array([1 if greedy else params.top_k], np.int64),
            "top_p": np.array([1.0 if greedy else params.top_p]),
        })[0]  # fmt: skip
        for b in range(16):
            want = sample(logits[b : b + 1], params, Fixed(u[b : b + 1]))[0]  # type: ignore[arg-type]
            assert got[b] == want, (trial, b)
        srt = -np.sort(-logits, axis=1)
        ties += int((srt[:, 1:] == srt[:, :-1]).sum())
    assert ties > 0  # equal logits were among the rows


def test_int4_covers_the_frame_heads_unless_asked_not_to(tmp_path: Path) -> None:
    """The frame's heads (one weight a step) are what ``--no-quantize-lm-head`` keeps float; its
    decoder body is quantized either way, though no ``past_lens`` input marks it a decoder."""
    import onnx

    from edgeomni.builder.quantize import Quantization, quantize_file
    from edgeomni.export.common.decoder import CausalLM, DecoderConfig
    from edgeomni.export.common.predictor_frame import export_predictor_frame

    cfg = DecoderConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                        intermediate_size=96, vocab_size=64, rms_norm_eps=1e-6,
                        rope_theta=10000.0, lm_heads=3)  # fmt: skip
    torch.manual_seed(0)
    module = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.02)
    raw = export_predictor_frame(module, tmp_path / "raw" / "frame.onnx")
    graph = onnx.load(str(raw), load_external_data=False).graph
    assert {i.name for i in graph.input} >= {"talker_hidden", "code_tables"}
    assert not any(n.op_type == "Transpose" and n.input[0] in {t.name for t in graph.initializer}
                   for n in graph.node)  # fmt: skip
    for lm_head, floats in ((True, 0), (False, 3)):
        report = quantize_file(raw, tmp_path / f"q{lm_head}.onnx",
                               Quantization("int4_rtn", 32, lm_head=lm_head))  # fmt: skip
        assert report is not None
        # 2 layers x (qkv, o, gate_up, down), and the 3 heads unless kept float
        assert report["weights"] == 8 + 3 - floats
        assert report["lm_head"] is lm_head
        assert len(report["float_weights"]) == floats
