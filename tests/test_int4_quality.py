"""What int4 weights cost, measured where it means something: the tiny Qwen3 trained on real text
(tests/trained_qwen3), held-out perplexity through edgeomni's engines against its fp32 engine.

The issue's bars: int4_rtn at group 32 within 5% of fp32's perplexity; int4_awq no worse than
int4_rtn. The defaults are what a user gets: the lm_head quantized too, ONNX Runtime's CPU kernel
computing in int8 (accuracy level 4), int4_awq calibrated on the shipped text unless a
--calibration file is given (tests/trained_qwen3/calibration.json: paragraphs of the model's
training text). docs/quantization.md has the whole table, on all 88 held-out windows too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trained_qwen3 import perplexity as ppl

from edgeomni.export.family import BuildArgs

CALIBRATION = str(ppl.HERE / "calibration.json")
BUILDS = {
    "rtn g32": dict(quantization="int4_rtn", group_size=32),
    "awq g32": dict(quantization="int4_awq", group_size=32),
    "awq g32, own calibration": dict(quantization="int4_awq", group_size=32,
                                     calibration=CALIBRATION),  # fmt: skip
    "rtn g128": dict(quantization="int4_rtn", group_size=128),
    "awq g128": dict(quantization="int4_awq", group_size=128),
}


@pytest.fixture(scope="module")
def scores(trained_qwen3: ppl.Baseline, exports, tmp_path_factory) -> dict[str, Any]:
    """Each build's held-out scores, and its engine's config.json quantization record."""
    return quantized_scores(trained_qwen3, BUILDS, exports, tmp_path_factory.mktemp("int4-quality"))


def quantized_scores(
    baseline: ppl.Baseline, builds: dict[str, dict[str, Any]], exports: Any, root: Path
) -> dict[str, Any]:
    """Each build of the baseline's checkpoint, scored against it (perplexity.against), with
    its ``engine_dir``."""
    out = {}
    for name, quant in builds.items():
        engine = root / name.replace(" ", "-").replace(",", "")
        assert exports.build(baseline.ckpt, engine, BuildArgs(**ppl.BUILD, **quant))
        out[name] = dict(ppl.against(baseline, engine, name), engine_dir=engine)
    return out


def test_int4_rtn_g32_is_within_5_percent_of_fp32(scores: dict[str, Any]) -> None:
    s = scores["rtn g32"]
    assert s["record"]["lm_head"] is True and s["record"]["float_weights"] == []
    assert 1.0 < s["ratio"] < 1.05  # int4 loses something, and not more than the bound
    assert s["agreement"] > 0.75  # measured 0.849
    assert 0 < s["kl"] < 0.1


@pytest.mark.parametrize(("awq", "rtn"), [("awq g32", "rtn g32"),
                                          ("awq g32, own calibration", "rtn g32"),
                                          ("awq g128", "rtn g128")])  # fmt: skip
def test_int4_awq_is_no_worse_than_rtn(scores: dict[str, Any], awq: str, rtn: str) -> None:
    """Measured on these windows: g32 +2.47% (shipped text) and +2.79% (own calibration)
    against RTN's +3.60%; g128 +3.50% against +5.06%."""
    record = scores[awq]["record"]
    assert record["method"] == "int4_awq" and record["awq"]["calibrated"] is True
    assert record["awq"]["error_vs_rtn"] < 1.0  # the search's own measure, on its own data
    assert record["awq_scaled_inputs"]["folded_into_norms"] > 0
    assert scores[awq]["ppl"] <= scores[rtn]["ppl"]
