"""The tiny random Qwen3-Omni checkpoint and its transformers reference runs.

Later parity tests trust these references, so this file checks that the checkpoint is wired the
way the real model is (ids, vocab bands, group counts) and that its outputs can tell a broken
pipeline from a working one: deterministic, prompt-, speaker- and media-dependent, with audio that
depends on the codes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import omni_reference as ref
import pytest
import torch

from edgeomni.export.tiny_omni import SPECIALS

PROMPT_A = "What is the capital of France?"  # runs to the 30-frame cap
PROMPT_B = "Write a short poem about rain."  # the talker stops on codec EOS after 27 frames
MAX_NEW = 16
FRAMES = 30
SAMPLES_PER_FRAME = 1920
LOST_PER_CHUNK = 555


def tone(seconds: float, hz: float, seed: int) -> np.ndarray:
    """A 16 kHz test waveform: a sine plus a little noise."""
    t = np.arange(int(seconds * ref.SAMPLE_RATE_IN)) / ref.SAMPLE_RATE_IN
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    return (0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32)


def picture(height: int, width: int, seed: int) -> np.ndarray:
    """A random uint8 RGB image whose sides are multiples of 32 (no resize needed)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def bundle(omni_ckpt: Path) -> ref.OmniBundle:
    return ref.load_bundle(omni_ckpt)


@pytest.fixture(scope="module")
def refs(bundle: ref.OmniBundle) -> dict[str, ref.OmniReference]:
    """Each reference run once (about 1 s each) and shared by the tests below."""
    kw = dict(max_new_tokens=MAX_NEW, max_frames=FRAMES)
    return {
        "a": ref.reference_text(bundle, PROMPT_A, **kw),
        "a_again": ref.reference_text(bundle, PROMPT_A, **kw),
        "b": ref.reference_text(bundle, PROMPT_B, **kw),
        "a_chelsie": ref.reference_text(bundle, PROMPT_A, speaker="chelsie", **kw),
        "audio": ref.reference_audio(bundle, tone(1.0, 220.0, seed=0), **kw),
        "audio2": ref.reference_audio(bundle, tone(1.0, 880.0, seed=1), **kw),
        "image": ref.reference_image(bundle, picture(64, 96, seed=0), **kw),
        "image2": ref.reference_image(bundle, picture(64, 96, seed=1), **kw),
    }


def test_config_matches_tokenizer_and_constraints(omni_ckpt: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from edgeomni.export import tiny

    assert "qwen3_omni_moe" in tiny.MAKERS
    cfg = AutoConfig.from_pretrained(omni_ckpt)
    tok = AutoTokenizer.from_pretrained(omni_ckpt)
    thinker, talker, c2w = cfg.thinker_config, cfg.talker_config, cfg.code2wav_config
    text = thinker.text_config
    assert len(tok) == text.vocab_size == 512
    ids = tok.convert_tokens_to_ids
    assert (cfg.im_start_token_id, cfg.im_end_token_id) == (ids("<|im_start|>"), ids("<|im_end|>"))
    assert (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id) == (
        ids("<|tts_pad|>"),
        ids("<|tts_bos|>"),
        ids("<|tts_eos|>"),
    )
    for word, got in [
        ("system", cfg.system_token_id),
        ("user", cfg.user_token_id),
        ("assistant", cfg.assistant_token_id),
    ]:
        assert tok.encode(word, add_special_tokens=False) == [got]
    assert thinker.user_token_id == cfg.user_token_id
    for sub in (thinker, talker):
        assert sub.audio_token_id == ids("<|audio_pad|>") == tok.audio_token_id
        assert sub.image_token_id == ids("<|image_pad|>") == tok.image_token_id
        assert sub.video_token_id == ids("<|video_pad|>") == tok.video_token_id
        assert sub.audio_start_token_id == ids("<|audio_start|>")
        assert sub.vision_start_token_id == ids("<|vision_start|>")
    special_ids = [ids(t) for t in SPECIALS]
    assert len(set(special_ids)) == 13 and min(special_ids) == 512 - 13  # on top, as in Qwen
    for token, token_id in zip(SPECIALS, special_ids, strict=True):
        assert tok.encode(token, add_special_tokens=False) == [token_id]
        assert tok.decode([token_id], skip_special_tokens=True) == ""
    # talker: codec ids and speakers in the top 1024 ids, above a codebook of code2wav's size
    band = range(talker.text_config.vocab_size - 1024, talker.text_config.vocab_size)
    assert band.start == talker.code_predictor_config.vocab_size == c2w.codebook_size
    codec = [talker.codec_pad_id, talker.codec_bos_id, talker.codec_eos_token_id]
    codec += [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
    assert all(i in band for i in codec + list(talker.speaker_id.values()))
    assert sorted(talker.speaker_id) == ["chelsie", "ethan"]
    assert talker.num_code_groups == talker.code_predictor_config.num_code_groups == 16
    assert c2w.num_quantizers == 16
    assert 0 < talker.accept_hidden_layer <= text.num_hidden_layers
    assert talker.thinker_hidden_size == text.hidden_size == thinker.audio_config.output_dim
    assert thinker.vision_config.out_hidden_size == text.hidden_size
    assert talker.spatial_merge_size == thinker.vision_config.spatial_merge_size
    assert talker.text_config.shared_expert_intermediate_size > 0
    for sub_text in (text, talker.text_config):
        assert sum(sub_text.rope_parameters["mrope_section"]) * 2 == sub_text.head_dim
    assert max(thinker.vision_config.deepstack_visual_indexes) < thinker.vision_config.depth
    assert int(np.prod(list(c2w.upsample_rates) + list(c2w.upsampling_ratios))) == 1920


def test_checkpoint_loads_with_its_random_weights(omni_ckpt: Path) -> None:
    """Every tensor comes from the file: none missing (silently re-initialised) or unused."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        omni_ckpt, dtype=torch.float32, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    talker_router = model.talker.model.layers[0].mlp.gate.weight
    assert talker_router.abs().min() > 0  # HF inits the talker routers to zeros
    snake = model.code2wav.decoder[-2].alpha
    assert snake.std() > 0.01  # HF inits SnakeBeta to constants
    scale = model.code2wav.pre_transformer.layers[0].self_attn_layer_scale.scale
    assert scale.std() > 0.01  # HF inits layer scales to the constant 0.01
    gen = json.loads((omni_ckpt / "generation_config.json").read_text())
    assert gen["eos_token_id"] == model.config.im_end_token_id and gen["do_sample"] is False


def test_processor_files(omni_ckpt: Path, bundle: ref.OmniBundle) -> None:
    """The processor resolves to Whisper (128 mels) + Qwen2-VL processors and the chat template."""
    from transformers import AutoFeatureExtractor, AutoProcessor

    fe = AutoFeatureExtractor.from_pretrained(omni_ckpt)
    assert type(fe).__name__ == "WhisperFeatureExtractor" and fe.feature_size == 128
    assert fe.sampling_rate == ref.SAMPLE_RATE_IN
    try:
        processor = AutoProcessor.from_pretrained(omni_ckpt)
    except (ImportError, ValueError) as err:
        # The Qwen2-VL video processor needs torchvision (the image one Pillow or torchvision),
        # which this project does not install: the classes resolve, only their backend is missing.
        assert "Qwen2VL" in str(err) and "torchvision" in str(err).lower()
        assert bundle.processor is None
    else:
        assert type(processor).__name__ == "Qwen3OmniMoeProcessor"
        assert type(processor.image_processor).__name__.startswith("Qwen2VLImageProcessor")
        assert processor.image_processor.patch_size == 16
    text = bundle.tokenizer.apply_chat_template(
        ref.messages_for("Hi", audio=True, image=True, system="Be brief."),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "<|audio_start|><|audio_pad|><|audio_end|><|vision_start|><|image_pad|><|vision_end|>"
        "Hi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_inputs_without_processor_equal_processor(bundle: ref.OmniBundle) -> None:
    """The fallback input builder gives the processor's tensors exactly (where it loads)."""
    if bundle.processor is None:
        pytest.skip("AutoProcessor needs Pillow and torchvision, not installed here")
    parts = dataclasses.replace(bundle, processor=None)
    for kw in (dict(audio=tone(2.3, 330.0, seed=2)), dict(image=picture(128, 64, seed=3))):
        want, got = ref.build_inputs(bundle, "Hi", **kw), ref.build_inputs(parts, "Hi", **kw)
        assert want.keys() == got.keys()
        for key in want:
            assert torch.equal(want[key], got[key]), key


def test_outputs_are_deterministic(refs: dict[str, ref.OmniReference]) -> None:
    a, again = refs["a"], refs["a_again"]
    assert a.thinker_tokens == again.thinker_tokens and a.text == again.text
    assert np.array_equal(a.codes, again.codes)
    assert np.array_equal(a.wav, again.wav)


def test_different_prompts_give_different_outputs(refs: dict[str, ref.OmniReference]) -> None:
    a, b = refs["a"], refs["b"]
    assert a.prompt_ids != b.prompt_ids
    assert a.thinker_tokens != b.thinker_tokens
    n = min(len(a.codes), len(b.codes))
    assert not np.array_equal(a.codes[:n], b.codes[:n])


def test_speaker_changes_codes(bundle: ref.OmniBundle, refs: dict[str, ref.OmniReference]) -> None:
    a, chelsie = refs["a"], refs["a_chelsie"]
    assert a.thinker_tokens == chelsie.thinker_tokens  # the speaker only reaches the talker
    n = min(len(a.codes), len(chelsie.codes))
    assert not np.array_equal(a.codes[:n], chelsie.codes[:n])
    with pytest.raises(NotImplementedError):
        ref.reference_text(bundle, PROMPT_A, speaker="nobody")


def test_media_inputs_reach_the_thinker(refs: dict[str, ref.OmniReference]) -> None:
    audio, audio2, image, image2 = (refs[k] for k in ("audio", "audio2", "image", "image2"))
    mel = audio.inputs["feature_attention_mask"].sum()
    assert audio.inputs["input_features"].shape == (1, 128, 100) and mel == 100
    assert audio.prompt_ids == audio2.prompt_ids  # same length, so same placeholders
    assert audio.thinker_tokens != audio2.thinker_tokens
    assert image.inputs["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert image.inputs["pixel_values"].shape == (24, 3 * 2 * 16 * 16)
    assert image.thinker_tokens != image2.thinker_tokens


def test_placeholder_counts(bundle: ref.OmniBundle, refs: dict[str, ref.OmniReference]) -> None:
    tok = bundle.tokenizer
    assert refs["audio"].prompt_ids.count(tok.audio_token_id) == ref.num_audio_tokens(100) == 13
    assert refs["image"].prompt_ids.count(tok.image_token_id) == 4 * 6 // 4
    assert tok.audio_token_id not in refs["a"].prompt_ids


@pytest.mark.parametrize("name", ["a", "b", "a_chelsie", "audio", "image"])
def test_codes(refs: dict[str, ref.OmniReference], name: str) -> None:
    r = refs[name]
    assert r.codes.dtype == np.int64 and r.codes.ndim == 2 and r.codes.shape[1] == 16
    assert 20 <= len(r.codes) <= FRAMES
    assert r.codes.min() >= 0 and r.codes.max() < 64
    assert len(set(r.codes[:, 0].tolist())) >= 5
    assert len(np.unique(r.codes[:, 1:])) >= 16  # the code predictor's groups vary too
    assert r.codes[:, 0].tolist() == r.talker_tokens[: len(r.codes)]
    assert all(0 <= t < 512 for t in r.thinker_tokens) and len(r.thinker_tokens) <= MAX_NEW


def test_talker_stop_paths(refs: dict[str, ref.OmniReference]) -> None:
    """One reference stops on codec EOS and one at the frame cap, so parity covers both."""
    assert not refs["a"].talker_stopped and len(refs["a"].codes) == FRAMES
    assert refs["b"].talker_stopped and len(refs["b"].codes) < FRAMES


@pytest.mark.parametrize("name", ["a", "b", "audio", "image"])
def test_wav(bundle: ref.OmniBundle, refs: dict[str, ref.OmniReference], name: str) -> None:
    r = refs[name]
    frames = len(r.codes)
    assert r.wav.dtype == np.float32 and r.wav.ndim == 1
    assert np.isfinite(r.wav).all() and np.abs(r.wav).max() <= 1.0
    assert r.wav.std() > 0.02 and np.abs(r.wav).max() < 0.99  # sounding, not clamped flat
    assert len(r.wav) == frames * SAMPLES_PER_FRAME - LOST_PER_CHUNK
    assert len(r.wav) == ref.chunked_wav_length(frames, SAMPLES_PER_FRAME, LOST_PER_CHUNK)
    assert np.array_equal(ref.whole_utterance_wav(bundle.model, r.codes), r.wav)  # one chunk


def test_audio_depends_on_codes(bundle: ref.OmniBundle, refs: dict[str, ref.OmniReference]) -> None:
    codes = refs["a"].codes
    base = ref.whole_utterance_wav(bundle.model, codes)
    for group in (0, 15):
        changed = codes.copy()
        changed[10, group] = (changed[10, group] + 1) % 64
        diff = np.abs(ref.whole_utterance_wav(bundle.model, changed) - base)
        assert diff.max() > 0.01 * np.abs(base).max()
        assert diff[: 8 * SAMPLES_PER_FRAME].max() == 0  # causal: earlier audio unchanged


def test_chunked_decode_rule_past_300_frames(bundle: ref.OmniBundle) -> None:
    """Over 300 frames generate()'s chunked decode is 555 samples shorter per chunk."""
    frames = 310
    codes = np.random.default_rng(0).integers(0, 64, (frames, 16))
    whole = ref.whole_utterance_wav(bundle.model, codes)
    with ref.single_thread(), torch.no_grad():
        chunked = bundle.model.code2wav.chunked_decode(
            torch.from_numpy(codes).T[None], chunk_size=ref.CHUNK_SIZE, left_context_size=25
        )
    chunked = chunked.reshape(-1).numpy()
    assert len(whole) == frames * SAMPLES_PER_FRAME - LOST_PER_CHUNK
    assert len(chunked) == ref.chunked_wav_length(frames, SAMPLES_PER_FRAME, LOST_PER_CHUNK)
    assert len(chunked) == frames * SAMPLES_PER_FRAME - 2 * LOST_PER_CHUNK
    first = ref.CHUNK_SIZE * SAMPLES_PER_FRAME - LOST_PER_CHUNK
    np.testing.assert_allclose(chunked[:first], whole[:first], atol=1e-4)
    # the next chunk resumes at frame 300: the one pass's samples [first, 300 * 1920) are skipped
    resume = ref.CHUNK_SIZE * SAMPLES_PER_FRAME
    np.testing.assert_allclose(chunked[first:], whole[resume:], atol=1e-4)
