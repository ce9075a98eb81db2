"""mrope.py equals transformers' get_rope_index: Qwen3-Omni's (``rope_index``) for Qwen3-Omni
prompts, Qwen3-VL's (``vision_rope_index``) for images and videos of every shape and count."""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
import torch

from edgeomni.runtime.media.mrope import (
    MropeIds,
    audio_output_length,
    rope_index,
    vision_rope_index,
)

IDS = MropeIds(
    image_token_id=10,
    video_token_id=11,
    audio_token_id=12,
    vision_start_token_id=13,
    audio_start_token_id=14,
)
VEND, AEND = 15, 16


def hf_rope_index(tokens, image_grids, mel_frames):
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    cls = m.Qwen3OmniMoePreTrainedModelForConditionalGeneration
    config = types.SimpleNamespace(
        **{
            k: getattr(IDS, k)
            for k in (
                "image_token_id",
                "video_token_id",
                "audio_token_id",
                "vision_start_token_id",
                "audio_start_token_id",
                "position_id_per_seconds",
            )
        },  # fmt: skip
        audio_config=types.SimpleNamespace(n_window=IDS.audio_n_window),
    )
    fake = types.SimpleNamespace(
        config=config,
        spatial_merge_size=IDS.spatial_merge_size,
        get_llm_pos_ids_for_vision=functools.partial(cls.get_llm_pos_ids_for_vision, None),
    )
    ids = torch.tensor([tokens])
    pos, delta = cls.get_rope_index(
        fake,
        ids,
        image_grid_thw=torch.tensor(image_grids) if image_grids else None,
        attention_mask=torch.ones_like(ids),
        audio_seqlens=torch.tensor(mel_frames) if mel_frames else None,
    )
    return pos[:, 0].long().numpy(), int(delta.reshape(-1)[0])


def image(grid):
    t, h, w = grid
    return [IDS.vision_start_token_id] + [IDS.image_token_id] * (t * h * w // 4) + [VEND]


def audio(frames):
    return [IDS.audio_start_token_id] + [IDS.audio_token_id] * audio_output_length(frames) + [AEND]


CASES = [
    ("text", [1, 2, 3, 4, 5], [], []),
    ("audio only", [1, 2, *audio(345), 3, 4], [], [345]),
    ("image", [1, 2, *image((1, 4, 6)), 3, 4, 5], [(1, 4, 6)], []),
    ("image then audio", [1, *image((1, 8, 4)), 2, *audio(100), 3], [(1, 8, 4)], [100]),
    (
        "audio then two images",
        [7, *audio(57), 8, *image((1, 2, 2)), *image((2, 4, 4)), 9],
        [(1, 2, 2), (2, 4, 4)],
        [57],
    ),  # fmt: skip
]


@pytest.mark.parametrize(("name", "tokens", "grids", "frames"), CASES, ids=[c[0] for c in CASES])
def test_rope_index_matches_transformers(name, tokens, grids, frames) -> None:
    expected, expected_delta = hf_rope_index(tokens, grids, frames)
    pos, delta = rope_index(tokens, IDS, image_grids=grids, audio_mel_frames=frames)
    np.testing.assert_array_equal(pos, expected)
    assert delta == expected_delta


def test_audio_output_length_matches_transformers() -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        _get_feat_extract_output_lengths,
    )

    for frames in (1, 57, 99, 100, 101, 345, 3000):
        assert audio_output_length(frames) == int(
            _get_feat_extract_output_lengths(torch.tensor(frames))
        )


def test_mismatched_placeholders_are_refused() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        rope_index([1, *image((1, 4, 4))[:-2], 2], IDS, image_grids=[(1, 4, 4)])


# -- Qwen3-VL --------------------------------------------------------------------------------
def hf_vision_rope_index(tokens, image_grids, video_grids, merge=2):
    """Qwen3VLModel.get_rope_index on one prompt (mm_token_type_ids as its processor makes
    them: 1 on image placeholders, 2 on video ones) for a ViT of spatial merge ``merge``."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=merge))
    )
    fake.get_vision_position_ids = functools.partial(Qwen3VLModel.get_vision_position_ids, fake)
    ids = torch.tensor([tokens])
    kinds = (ids == IDS.image_token_id).int() + 2 * (ids == IDS.video_token_id).int()
    pos, delta = Qwen3VLModel.get_rope_index(
        fake, ids, kinds,
        image_grid_thw=torch.tensor(image_grids) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids) if video_grids else None,
    )  # fmt: skip
    return pos[:, 0].numpy(), int(delta.reshape(-1)[0])


def video(grid):
    """A video as Qwen3VLProcessor writes it: each temporal group a timestamp (two text
    tokens here) and its placeholders between the vision brackets."""
    t, h, w = grid
    return [tok for _ in range(t) for tok in
            (21, 22, IDS.vision_start_token_id, *[IDS.video_token_id] * (h * w // 4), VEND)]  # fmt: skip


VL_CASES = [
    ("tall", [1, *image((1, 10, 4)), 2, 3], [(1, 10, 4)], []),
    ("flat", [1, *image((1, 4, 10)), 2, 3], [(1, 4, 10)], []),
    ("two of one shape", [1, *image((1, 6, 8)), *image((1, 6, 8)), 2], [(1, 6, 8)] * 2, []),
    (
        "wide then tall",
        [1, *image((1, 6, 8)), 5, *image((1, 10, 4)), 2],
        [(1, 6, 8), (1, 10, 4)],
        [],
    ),  # fmt: skip
    ("wide then flat", [*image((1, 6, 8)), *image((1, 4, 10)), 2], [(1, 6, 8), (1, 4, 10)], []),
    ("tall video", [1, *video((2, 10, 4)), 2], [], [(2, 10, 4)]),
    (
        "video, tall image, flat video",
        [1, *video((3, 4, 6)), *image((1, 12, 2)), 6, *video((1, 2, 8)), 2],
        [(1, 12, 2)],
        [(3, 4, 6), (1, 2, 8)],
    ),  # fmt: skip
]


@pytest.mark.parametrize(("name", "tokens", "images", "videos"), VL_CASES,
                         ids=[c[0] for c in VL_CASES])  # fmt: skip
def test_vision_rope_index_matches_transformers(name, tokens, images, videos) -> None:
    expected, expected_delta = hf_vision_rope_index(tokens, images, videos)
    pos, delta = vision_rope_index(tokens, IDS.image_token_id, IDS.video_token_id,
                                   image_grids=images, video_grids=videos)  # fmt: skip
    np.testing.assert_array_equal(pos, expected)
    assert delta == expected_delta


@pytest.mark.parametrize("merge", [1, 3])
def test_vision_rope_index_at_other_merges(merge: int) -> None:
    """A ViT merging 1x1 or 3x3 patches: a tall image, then a flat one, as transformers."""
    grids = [(1, 5 * merge, 2 * merge), (1, 2 * merge, 4 * merge)]
    tokens = [1]
    for grid in grids:
        tokens += [IDS.vision_start_token_id, *[IDS.image_token_id] * (grid[1] * grid[2] //
                   merge**2), VEND, 5]  # fmt: skip
    expected, expected_delta = hf_vision_rope_index(tokens, grids, [], merge)
    pos, delta = vision_rope_index(tokens, IDS.image_token_id, IDS.video_token_id,
                                   image_grids=grids, merge=merge)  # fmt: skip
    np.testing.assert_array_equal(pos, expected)
    assert delta == expected_delta
