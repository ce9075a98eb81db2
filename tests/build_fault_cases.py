"""Setups of tests/test_build_faults.py's rows for issue 30: checkpoints whose tokenizer or
chat template edge-infer would refuse, Qwen3-TTS configurations upstream accepts (built, or
refused by key before any export), the tiny checkpoint writers, and positions past a model's
limit. Each takes the row's Env (test_build_faults.Env) and returns the command's argv."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Env = Any  # test_build_faults.Env: importing it here would import that module twice
Setup = Callable[[Env], list[str]]


def text_file(name: str, text: str | bytes, drop: tuple[str, ...] = ()) -> Setup:
    """The tiny Qwen3 with one text file written as ``text`` (others dropped)."""

    def setup(env: Env) -> list[str]:
        ckpt = env.ckpt(drop=drop)
        write = (ckpt / name).write_bytes if isinstance(text, bytes) else (ckpt / name).write_text
        write(text)  # type: ignore[arg-type]
        return env.argv(env.tmp / "eng", ckpt=ckpt)

    return setup


def template_in_config(value: object) -> Setup:
    """The tiny Qwen3's chat template moved into tokenizer_config.json as ``value``."""

    def setup(env: Env) -> list[str]:
        ckpt = env.ckpt(drop=("chat_template.jinja",))
        cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
        (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": value}))
        return env.argv(env.tmp / "eng", ckpt=ckpt)

    return setup


REMOVE = object()


def tts_config(file: str, key: str, value: object) -> Setup:
    """The tiny Base Qwen3-TTS with one key (a dotted path) of file set, or removed."""

    def setup(env: Env) -> list[str]:
        ckpt = env.ckpt("tts_base_ckpt")
        cfg = json.loads((ckpt / file).read_text())
        *parents, last = key.split(".")
        node = cfg
        for name in parents:
            node = node[name]
        if value is REMOVE:
            del node[last]
        else:
            node[last] = value
        (ckpt / file).write_text(json.dumps(cfg))
        return env.argv(env.tmp / "eng", ckpt=ckpt)

    return setup


def tts_vocab_not_json(env: Env) -> list[str]:
    ckpt = env.ckpt("tts_base_ckpt")
    (ckpt / "vocab.json").write_text('{"a": 1,')
    return env.argv(env.tmp / "eng", ckpt=ckpt)


def tts_merges_out_of_vocabulary(env: Env) -> list[str]:
    ckpt = env.ckpt("tts_base_ckpt")
    with (ckpt / "merges.txt").open("a") as f:
        f.write("zz qq\n")
    return env.argv(env.tmp / "eng", ckpt=ckpt)


def tts_accepted_variants(env: Env) -> list[str]:
    """A Base checkpoint in configurations upstream accepts that the release's do not show: a
    codec encoder without quantizer projections (issue 30), two semantic codebooks, biases,
    GQA, conv shortcuts, no window, upstream's defaults for left-out keys, a code predictor
    as wide as its talker, another speaker encoder shape."""
    from edgeomni.export import tiny_tts

    remove = tiny_tts.REMOVE
    ckpt = tiny_tts.make_checkpoint(env.tmp / "ckpt", "base", "tiny", overrides={
        "encoder_config": {**tiny_tts.no_vq_projection()["encoder_config"],
                           "num_semantic_quantizers": 2, "attention_bias": True,
                           "num_hidden_layers": 3, "num_key_value_heads": 1,
                           "use_conv_shortcut": True, "num_residual_layers": 2,
                           "sliding_window": None, "head_dim": None},
        "speech_tokenizer": {"encoder_valid_num_quantizers": remove,
                             "encode_downsample_rate": remove},
        "decoder_config": {"attention_bias": True, "num_key_value_heads": 1, "head_dim": 16,
                           "hidden_act": remove},
        "talker_config": {"attention_bias": True},
        "code_predictor_config": {"attention_bias": True, "hidden_size": 32,
                                  "num_attention_heads": 4, "head_dim": 8},
        "speaker_encoder_config": {"enc_res2net_scale": 2, "enc_kernel_sizes": [3, 3, 3, 3, 1]},
    })  # fmt: skip
    argv = env.argv(env.tmp / "eng", ckpt=ckpt)
    on_both_cores(env, ckpt, argv)
    return argv


def on_both_cores(env: Env, ckpt: Path, argv: list[str]) -> None:
    """The build's exports shared with the session's second process (tests/export_store.py:
    planned here, taken by edge-build's exports, which go through the store until the row ends)."""
    from contextlib import ExitStack

    from edgeomni.export.family import BuildArgs

    exports = env.request.getfixturevalue("exports")
    pairs = zip(argv, argv[1:], strict=False)
    sizes = {flag: int(value) for flag, value in pairs if flag.startswith("--max-")}
    exports.prefetch(ckpt, BuildArgs(sizes["--max-batch-size"], sizes["--max-input-len"],
                                     sizes["--max-kv-cache-capacity"]))  # fmt: skip
    stack = ExitStack()
    stack.enter_context(exports.reused())
    env.request.addfinalizer(stack.close)


def clones_as_transformers_mimi(env: Env) -> None:
    """The built codec encoder gives transformers' Mimi codes, and a voice clone runs."""
    import numpy as np
    import onnxruntime as ort
    import soundfile as sf
    import torch
    from test_build_faults import manifest_matches
    from test_qwen3_tts_speech_encoder import _transformers_mimi, _wav

    from edgeomni.runtime import cli as infer

    eng = env.tmp / "eng"
    manifest_matches(eng)
    wav = np.stack([_wav(7 * 1920 + 500, seed=1), _wav(7 * 1920 + 500, seed=2)])
    engine = eng / "speech_tokenizer_encoder" / "speech_tokenizer_encoder.onnx"
    codes = ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"]).run(
        None, {"wav": wav}
    )[0]
    mimi = _transformers_mimi(env.tmp / "ckpt" / "speech_tokenizer")
    assert mimi.quantizer.semantic_residual_vector_quantizer.input_proj is None
    with torch.no_grad():
        expected = mimi.encode(torch.from_numpy(wav)[:, None], num_quantizers=16).audio_codes
    np.testing.assert_array_equal(codes, expected.transpose(1, 2).numpy())
    sf.write(env.tmp / "ref.wav", wav[0], 24000)
    out = env.tmp / "clone.wav"
    argv = ["--config", str(eng), "--prompt", "Hello world", "--ref-audio", str(env.tmp / "ref.wav"),
            "--ref-text", "Hello", "--language", "english", "--out-audio", str(out),
            "--sampling", '{"talker_max_new_tokens": 6}']  # fmt: skip
    assert infer.main(argv) == 0
    frames = sf.info(out).frames  # whole codec frames, at most the 6 asked for
    assert 0 < frames <= 6 * 1920 and frames % 1920 == 0


def tiny_into(tool: str, *extra: str, files: tuple[str, ...] = ("notes.txt",)) -> Setup:
    """python -m edgeomni.export.<tool> into a dir d holding files (the tool's argv)."""

    def setup(env: Env) -> list[str]:
        d = env.tmp / "d"
        d.mkdir()
        for name in files:
            (d / name).write_text("mine\n")
        return [*(("qwen3",) if tool == "tiny" else ()), str(d), *extra]

    return setup


def tiny_again(edit: bool) -> Setup:
    """A tiny checkpoint written into d, edited or not, then written again over it."""

    def setup(env: Env) -> list[str]:
        from edgeomni.export import tiny

        assert tiny.main(["qwen3", str(env.tmp / "d"), "--seed", "1"]) == 0
        if edit:
            with (env.tmp / "d" / "config.json").open("a") as f:
                f.write("\n")
        return ["qwen3", str(env.tmp / "d"), "--seed", "2"]

    return setup


def replaced_whole(env: Env) -> None:
    """Written anew (seed 2), its record listing exactly what is there."""
    from edgeomni.export import tiny

    assert tiny.own_previous(env.tmp / "d") == sorted(tiny._files(env.tmp / "d"))
    assert "model.safetensors" in (tiny.own_previous(env.tmp / "d") or [])


def tiny_args(*argv: str) -> Setup:
    return lambda env: [arg.replace("TMP", str(env.tmp)) for arg in argv]


def tiny_out_is_a_file(env: Env) -> list[str]:
    (env.tmp / "f").write_text("mine\n")
    return ["qwen3", str(env.tmp / "f"), "--seed", "1"]


def kept_mine(env: Env) -> None:
    assert (env.tmp / "d" / "notes.txt").read_text() == "mine\n"
    assert (env.tmp / "d" / "config.json").is_file()


def past_positions(env: Env) -> list[str]:
    (env.tmp / "eng").write_text("not a directory")  # stops the build after the cheap checks
    return [*env.argv(env.tmp / "eng"), "--max-kv-cache-capacity", "2048"]


def warned_of_positions(env: Env) -> None:
    assert (
        "--max-kv-cache-capacity 2048 is past the model's position limit: llm 1024 "
        "(max_position_embeddings)" in env.logs.text
    )


def export_error_with_cause(env: Env) -> list[str]:
    """torch's exporter wraps the real error in a message of many lines."""
    from edgeomni.export.families.qwen3.build import HOOKS as qwen3

    def broken(*args: object, **kwargs: object) -> Path:
        try:
            raise TypeError("'NoneType' object is not callable")
        except TypeError as e:
            raise RuntimeError("Failed to export.\n\n## Advice\nmany lines") from e

    env.monkeypatch.setattr(qwen3, "export_component", broken)
    return env.argv(env.engine())


def tts_base_awq(calibration: dict[str, Any] | None) -> Setup:
    """Issue 50: int4_awq on the tiny Base Qwen3-TTS, whose calibration requests must clone a
    voice, with or without a --calibration file holding ``calibration``."""

    def setup(env: Env) -> list[str]:
        extra = ["--quantization", "int4_awq"]
        if calibration is not None:
            (env.tmp / "calib.json").write_text(json.dumps(calibration))
            extra += ["--calibration", str(env.tmp / "calib.json")]
        ckpt = env.request.getfixturevalue("tts_base_ckpt")
        return env.argv(env.tmp / "eng", *extra, ckpt=ckpt)

    return setup


def qwen3_config(key: str, value: object) -> Setup:
    """Issue 50: the tiny Qwen3 with one config.json key set to ``value``."""

    def setup(env: Env) -> list[str]:
        ckpt = env.ckpt()
        cfg = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**cfg, key: value}))
        return env.argv(env.tmp / "eng", ckpt=ckpt)

    return setup
