"""Qwen3-Omni vision encoder: numpy index precompute == transformers' helpers, engine == HF.

One tiny random encoder (hidden 32, depth 2, 2 heads, patch 16, 8x8 position grid, DeepStack
after both layers) is exported and built once per session; one of other dimensions (merge 3,
patch 14, a position table smaller than the images) by the test that needs it; the exported
forward at other Qwen3-VL vision configs runs in torch against Qwen3VLVisionModel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from edgeomni.export.common import artifacts
from edgeomni.export.media import vision_encoder as vis
from edgeomni.plugins import attention as attention_plugin
from edgeomni.runtime.media import visual_encoder as rt

GRIDS = [[1, 8, 12], [1, 16, 16], [1, 4, 6], [1, 12, 4]]  # wide, square, wide, tall
TOL = 5e-6  # relative to max|out|


def tiny_model(**config: Any) -> Any:
    """Matrices at std 1/sqrt(fan_in) (HF's 0.02 init would make every image look alike),
    the position table at std 1 so its interpolation matters, norms ~1, biases ~N(0, 0.1);
    ``config`` overrides the vision config's fields."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeVisionEncoderConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeVisionEncoder,
    )

    tiny = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=16,
        temporal_patch_size=2,
        spatial_merge_size=2,
        out_hidden_size=64,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0, 1],
    )
    cfg = Qwen3OmniMoeVisionEncoderConfig(**{**tiny, **config})
    torch.manual_seed(0)
    model = Qwen3OmniMoeVisionEncoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "pos_embed.weight":
                p.normal_(0, 1)
            elif p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(p[0].numel()))
            elif "norm" in name or "ln_q" in name:
                p.normal_(1, 0.1) if name.endswith("weight") else p.normal_(0, 0.1)
            else:
                p.normal_(0, 0.1)
    return model


def build(model: Any, root: Any) -> dict[str, Any]:
    """``model`` exported and built for ONNX Runtime on the CPU under ``root``."""
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.family import BuildArgs

    raw = vis.export_visual(model, root / "raw" / vis.ENGINE)
    folder = root / "visual"
    folder.mkdir()
    build_engine(raw, folder / vis.ENGINE, BuildArgs(1, 1, 1))
    artifacts.write_engine_config(
        folder, vis.visual_engine_config(model.config, "onnxruntime", "cpu")
    )
    return {"model": model, "raw": raw, "encoder": rt.VisualEncoder(folder, threads=2)}


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build(tiny_model(), tmp_path_factory.mktemp("visual"))


def hf_encode(model: Any, pixel_values: np.ndarray, grid: list[list[int]]) -> Any:
    with torch.no_grad():
        return model(torch.from_numpy(pixel_values), torch.tensor(grid))


def check(built: dict[str, Any], grid: list[list[int]], seed: int) -> None:
    cfg = built["model"].config
    n, unit = sum(t * h * w for t, h, w in grid), cfg.spatial_merge_size**2
    dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    pixel_values = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    embeds, deepstack = built["encoder"].encode(pixel_values, grid)
    ref = hf_encode(built["model"], pixel_values, grid)
    assert embeds.shape == (n // unit, 64) and deepstack.shape == (2, n // unit, 64)
    for ours, theirs in [
        (embeds, ref.pooler_output),
        *zip(deepstack, ref.deepstack_features, strict=True),
    ]:
        theirs = theirs.numpy()
        diff = float(np.abs(ours - theirs).max())
        assert diff <= TOL * float(np.abs(theirs).max()), (grid, diff)


# -- numpy precompute == transformers.vision_utils ------------------------------------------
# (grid side of the position table, merge, grids): the table larger and smaller than the
# images, merges other than the releases' 2
PRECOMPUTE = [(8, 2, g) for g in (
    [[1, 8, 12]], [[1, 16, 16], [2, 4, 6]], [[3, 2, 2], [1, 6, 20]],
    [[1, 10, 4]], [[1, 6, 8], [1, 6, 8]], [[1, 6, 8], [1, 10, 4], [1, 4, 10]], [[2, 12, 2], [1, 2, 8]],
)] + [(4, 3, [[1, 15, 6], [1, 6, 15]]), (4, 1, [[1, 10, 4], [2, 3, 7]]), (48, 2, [[1, 6, 64]])]  # fmt: skip


@pytest.mark.parametrize(("side", "merge", "grid"), PRECOMPUTE)
def test_precompute_matches_transformers(side: int, merge: int, grid: list[list[int]]) -> None:
    from transformers import vision_utils as vu

    g = torch.tensor(grid)
    idx, wts = vu.get_vision_interpolation_indices_and_weights(
        g, num_grid_per_side=side, mode="bilinear", align_corners=True, spatial_merge_size=merge
    )
    ours_idx, ours_wts = rt.interpolation_taps(grid, side=side, merge=merge)
    np.testing.assert_array_equal(ours_idx, idx.numpy())
    np.testing.assert_array_equal(ours_wts, wts.numpy())  # bit-exact float32
    np.testing.assert_array_equal(rt.rotary_ids(grid, merge),
                                  vu.get_vision_position_ids(g, merge).numpy())  # fmt: skip
    tokens, lens, slots = rt.segment_layout(grid, merge)
    cu = vu.get_vision_cu_seqlens(g).numpy()
    np.testing.assert_array_equal(lens, np.diff(cu))
    n, width = int(cu[-1]), int(lens.max())
    assert tokens.shape == (len(lens), width) and slots.shape == (n,)
    flat = tokens.reshape(-1)
    np.testing.assert_array_equal(flat[slots], np.arange(n))  # every token round-trips
    for row, (start, length) in enumerate(zip(cu[:-1], lens, strict=True)):  # each row is one frame
        assert set(tokens[row].tolist()) == set(range(start, start + length))


# -- export --------------------------------------------------------------------------------
def test_attention_goes_through_the_plugin_op(built: dict[str, Any]) -> None:
    raw = onnx.load(str(built["raw"]), load_external_data=False)
    op = (attention_plugin.DOMAIN, attention_plugin.OP_TYPE)
    plugin = [n for n in raw.graph.node if (n.domain, n.op_type) == op]
    assert len(plugin) == 2
    assert all({a.name: a.i for a in n.attribute}["causal"] == 0 for n in plugin)
    assert [i.name for i in raw.graph.input] == list(vis.INPUTS)
    assert [o.name for o in raw.graph.output] == list(vis.OUTPUTS)


def test_engine_config(built: dict[str, Any]) -> None:
    cfg = built["encoder"].config
    assert (cfg["component"], cfg["engine"], cfg["format"]) == (
        "visual",
        "visual.onnx",
        artifacts.FORMAT,
    )
    assert (cfg["num_grid_per_side"], cfg["spatial_merge_size"], cfg["patch_dim"]) == (8, 2, 1536)
    assert cfg["deepstack_visual_indexes"] == [0, 1] and cfg["out_hidden_size"] == 64
    real = vis.visual_engine_config({"thinker_config": {"vision_config": {}}})  # class defaults
    assert (real["num_grid_per_side"], real["depth"], real["out_hidden_size"]) == (48, 27, 3584)
    assert built["encoder"].image_settings is None  # the fixture's build copied no settings
    processor = {"image_processor": {"patch_size": 16, "size": {"shortest_edge": 4096}}}
    with_settings = vis.visual_engine_config(built["model"].config, image_processor=processor)
    assert with_settings["image_processor"] == processor["image_processor"]


# -- engine == transformers ------------------------------------------------------------------
@pytest.mark.parametrize("grid", GRIDS, ids=["x".join(map(str, g)) for g in GRIDS])
def test_engine_matches_transformers(built: dict[str, Any], grid: list[int]) -> None:
    check(built, [grid], seed=sum(grid))


def test_mixed_batch_and_video(built: dict[str, Any]) -> None:
    """Several items and frames in one call: attention stays within each frame."""
    check(built, [*GRIDS, [3, 4, 4]], seed=7)


def test_other_vision_configs_match_transformers(tmp_path: Any) -> None:
    """A ViT unlike the releases' (merge 3, patch 14, 3 heads, a 4x4 position table smaller than
    the images) exports, builds and matches transformers on tall, wide and mixed layouts."""
    model = tiny_model(spatial_merge_size=3, patch_size=14, num_heads=4, hidden_size=48,
                       num_position_embeddings=16)  # fmt: skip
    other = build(model, tmp_path)
    assert other["encoder"].merge == 3 and other["encoder"].side == 4
    check(other, [[1, 15, 6]], seed=1)
    check(other, [[1, 6, 9], [1, 15, 6], [2, 3, 12]], seed=2)


def test_rejects_mismatched_inputs(built: dict[str, Any]) -> None:
    enc = built["encoder"]
    with pytest.raises(ValueError, match="multiples of 2"):
        enc.encode(np.zeros((15, 1536), np.float32), [1, 3, 5])
    with pytest.raises(ValueError, match="do not match"):
        enc.encode(np.zeros((10, 1536), np.float32), [1, 4, 4])


def test_taps_on_the_real_grid() -> None:
    """The real 48x48 position grid: in-range taps whose weights sum to 1."""
    idx, wts = rt.interpolation_taps([1, 64, 90], side=48, merge=2)
    assert idx.min() >= 0 and idx.max() < 48 * 48
    np.testing.assert_allclose(wts.sum(1), 1, atol=1e-6)


def test_load_visual_reads_the_checkpoint_names(built: dict[str, Any]) -> None:
    model = built["model"]
    state = {vis.PREFIX + k: v for k, v in model.state_dict().items()}
    loaded = vis.load_visual(
        state.__getitem__, {"thinker_config": {"vision_config": model.config.to_dict()}}
    )
    grid = [[1, 4, 6]]
    pixel_values = np.random.default_rng(3).standard_normal((24, 1536)).astype(np.float32)
    ours, ref = hf_encode(loaded, pixel_values, grid), hf_encode(model, pixel_values, grid)
    torch.testing.assert_close(ours.pooler_output, ref.pooler_output, rtol=0, atol=0)
    state[vis.PREFIX + "pos_embed.weight"] = torch.zeros(3, 32)
    with pytest.raises(ValueError, match="pos_embed.weight has shape"):
        vis.load_visual(state.__getitem__, model.config)


# -- the graph at other Qwen3-VL vision configs ----------------------------------------------
# overrides of the tiny ViT (Qwen3-VL's module): a position table smaller (side 4) and larger
# (48) than the images, patch 14, merges 1 and 3, one frame per temporal patch, DeepStack taps
# not after every layer, more heads
VL_CONFIGS = {
    "side4_patch14": dict(num_position_embeddings=16, patch_size=14),
    "side48": dict(num_position_embeddings=2304),
    "merge1_temporal1": dict(spatial_merge_size=1, temporal_patch_size=1),
    "merge3": dict(spatial_merge_size=3),
    "depth3_taps_0_2_heads8": dict(depth=3, deepstack_visual_indexes=[0, 2], num_heads=8),
}


@pytest.mark.parametrize("overrides", VL_CONFIGS.values(), ids=list(VL_CONFIGS))
def test_graph_matches_qwen3_vl_at_other_configs(overrides: dict[str, Any]) -> None:
    """The exported forward (VisualGraph, run in torch) with the runtime's indices equals
    transformers' Qwen3VLVisionModel for a tall image, and for two images of one shape, a wide
    one, a tall one and a two-frame video in one call."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from edgeomni.export.tiny_omni import redraw_parameters, tiny_vision_config

    cfg = Qwen3VLVisionConfig(**{**tiny_vision_config(), **overrides})
    model = Qwen3VLVisionModel(cfg).eval()
    redraw_parameters(model, torch.Generator().manual_seed(0), gain_std=1.0)
    graph = vis.VisualGraph(model, "deepstack_merger_list").eval()
    m, side = cfg.spatial_merge_size, math.isqrt(cfg.num_position_embeddings)
    dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    for grid in (
        [[1, 5 * m, 2 * m]],
        [[1, 3 * m, 4 * m]] * 2 + [[1, 5 * m, 2 * m], [2, 2 * m, 5 * m]],
    ):
        g = np.asarray(grid)
        pixels = torch.randn(int(g.prod(1).sum()), dim, generator=torch.Generator().manual_seed(1))
        feeds = [*rt.interpolation_taps(g, side, m), rt.rotary_ids(g, m), *rt.segment_layout(g, m)]
        with torch.no_grad():
            ref = model(pixels, grid_thw=torch.from_numpy(g))
            embeds, deepstack = graph(pixels, *(torch.from_numpy(f) for f in feeds))
        assert len(deepstack) == len(ref.deepstack_features) == len(cfg.deepstack_visual_indexes)
        for ours, theirs in zip([embeds, *deepstack], [ref.pooler_output, *ref.deepstack_features],
                                strict=True):  # fmt: skip
            assert ours.shape == theirs.shape
            assert float((ours - theirs).abs().max()) <= TOL * float(theirs.abs().max()), grid
