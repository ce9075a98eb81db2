"""The sampler an engine runs in its graph (export/common/sampler.py) draws what the host's
sampler (runtime/sampling.py) draws from the same logits and uniform numbers, on ONNX Runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from edgeomni.export.common.onnx_export import export_onnx  # noqa: E402
from edgeomni.export.common.sampler import draw_from_topk  # noqa: E402
from edgeomni.runtime.sampling import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sampling_cases import SETTINGS, K, compare_draws, settings_id  # noqa: E402


class _Draw(torch.nn.Module):
    def forward(self, values, indices, uniform, temperature, top_k, top_p):  # noqa: ANN001, ANN201
        return draw_from_topk(values, indices, uniform, temperature, top_k, top_p)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    from torch.export import Dim

    f64 = torch.float64
    args = (
        torch.zeros(2, K, dtype=torch.float16),
        torch.zeros(2, K, dtype=torch.int64),
        torch.zeros(2, dtype=f64),
        torch.ones(1, dtype=f64),
        torch.full((1,), 2, dtype=torch.int64),
        torch.ones(1, dtype=f64),
    )
    batch = Dim("batch")
    path = export_onnx(
        _Draw(),
        args,
        Path(tmp_path_factory.mktemp("sampler")) / "draw.onnx",
        input_names=["values", "indices", "uniform", "temperature", "top_k", "top_p"],
        output_names=["ids"],
        dynamic_shapes=({0: batch}, {0: batch}, {0: batch}, None, None, None),
    )
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _engine_draw(
    sess: ort.InferenceSession, logits: np.ndarray, u: np.ndarray, params: SamplingParams,
    gen: np.random.Generator,
) -> np.ndarray:  # fmt: skip
    """The engine's TopK output, its equal values shuffled (the sampler must not rely on the
    order a TopK kernel leaves ties in), through the exported sampler."""
    order = np.argsort(-logits, axis=1, kind="stable")[:, :K]
    order = np.take_along_axis(order, gen.permuted(np.tile(np.arange(K), (len(order), 1)),
                                                   axis=1), axis=1)  # fmt: skip
    values = np.take_along_axis(logits, order, axis=1).astype(np.float16)
    greedy = params.greedy
    return sess.run(None, {
        "values": values, "indices": order.astype(np.int64),
        "uniform": np.zeros_like(u) if greedy else u,
        "temperature": np.array([1.0 if greedy else params.temperature]),
        "top_k": np.array([1 if greedy else params.top_k], np.int64),
        "top_p": np.array([1.0 if greedy else params.top_p]),
    })[0]  # fmt: skip


@pytest.mark.parametrize("params", SETTINGS, ids=settings_id)
def test_engine_draws_what_the_host_draws(
    session: ort.InferenceSession, params: SamplingParams
) -> None:
    tied, undecided = compare_draws(lambda logits, u, gen: _engine_draw(session, logits, u,
                                                                     params, gen),
                                    params, vocab=700, trials=25, seed=11)  # fmt: skip
    assert tied > 0  # ties at the k-th value were among the rows
    assert undecided < 25 * 16 // 4


def test_a_row_the_top_k_cannot_decide_comes_out_as_minus_one(
    session: ort.InferenceSession,
) -> None:
    gen = np.random.default_rng(2)
    logits = (gen.standard_normal((3, 300))).astype(np.float16).astype(np.float32)
    logits[1] = 0.5  # every value equal: the K-th value equals the k-th
    logits[2, :100] = 3.0  # 100 equal best values: a greedy pick needs the lowest id
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
    got = _engine_draw(session, logits, gen.random(3), params, gen)
    assert got[1] == -1 and got[0] >= 0 and got[2] == -1
    greedy = _engine_draw(session, logits, np.zeros(3), SamplingParams(temperature=0.0), gen)
    assert greedy[1] == -1 and greedy[2] == -1  # 100 ties at the best: outside the K too
    assert greedy[0] == int(np.argmax(logits[0]))


def test_engine_sampling_is_a_cuda_build_default_and_can_be_set() -> None:
    from edgeomni.export.family import BuildArgs

    assert BuildArgs(1, 8, 16, device="cuda").engine_sampling is True
    assert BuildArgs(1, 8, 16).engine_sampling is False  # on the CPU drawing on the host is cheaper
    assert BuildArgs(1, 8, 16, engine_sampling=True).engine_sampling is True
    assert BuildArgs(1, 8, 16, device="cuda", engine_sampling=False).engine_sampling is False


def test_sampler_refuses_what_it_cannot_draw_from(tmp_path: Path) -> None:
    from edgeomni.export.common.decoder import CausalLM, DecoderConfig
    from edgeomni.export.common.onnx_export import export_causal_lm
    from edgeomni.export.common.sampler import WithSampler

    cfg = DecoderConfig(hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
                        intermediate_size=16, vocab_size=32, rms_norm_eps=1e-6,
                        rope_theta=1e4, lm_heads=3)  # fmt: skip
    lm = CausalLM(cfg)
    with pytest.raises(ValueError, match="do not match"):
        WithSampler(lm, 8, torch.zeros(2, 32, 8))  # one table short
    with pytest.raises(ValueError, match="top-k 1 must be in 2..32"):
        WithSampler(lm, 1, torch.zeros(3, 32, 8))
    with pytest.raises(ValueError, match="no excluded ids"):
        export_causal_lm(lm, tmp_path / "x.onnx", topk_exclude=(1,),
                         sampler_tables=torch.zeros(3, 32, 8))  # fmt: skip
