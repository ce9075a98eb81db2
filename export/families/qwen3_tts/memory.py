"""What edge-build --estimate counts for each Qwen3-TTS component, from the config files alone
(config.json and speech_tokenizer/config.json): each component's module as the export builds
it, on the meta device (shapes, no weights, no memory), and its host tables' shapes.

The codec's codebooks are counted as the engines store them: code2wav and the speech-tokenizer
encoder compute their tables from the codebooks' weights alone (sums over usage counts), which
the backend folds into constants (memory_plan.fold)."""

from __future__ import annotations

import torch

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, open_checkpoint, section
from edgeomni.export.common.decoder import DTYPES, CausalLM, dense_mlp
from edgeomni.export.common.memory_plan import F32, decoder_memory, float_memory, fold
from edgeomni.export.families.qwen3_tts import code2wav, speaker_encoder, speech_encoder
from edgeomni.export.families.qwen3_tts.config import (
    TOKENIZER,
    predictor_decoder_config,
    talker_decoder_config,
)
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.speech import code2wav_stream, parts


def memory_plan(ckpt: Checkpoint, component: Component, args: BuildArgs) -> ComponentMemory:
    config, name = ckpt.config, component.name
    dtype = DTYPES.get(args.dtype, torch.float32)
    with torch.device("meta"):
        if name == "talker":
            cfg = talker_decoder_config(config)
            module = CausalLM(cfg, dense_mlp(cfg)).to(dtype)
            text_vocab = section(config, "talker_config").get("text_vocab_size")
            if not isinstance(text_vocab, int):
                raise CheckpointError("config.json: talker_config.text_vocab_size is missing")
            tables = {"embedding": ((cfg.vocab_size, cfg.hidden_size), F32),
                      "text_embedding": ((text_vocab, cfg.hidden_size), F32)}  # fmt: skip
            return decoder_memory(module, tables, args.dtype)
        if name == "code_predictor":
            cfg = predictor_decoder_config(config)
            return parts.predictor_memory(CausalLM(cfg, dense_mlp(cfg)).to(dtype), args.dtype, args)
        if name == "speaker_encoder":
            settings = speaker_encoder.check_config(section(config, "speaker_encoder_config"))
            return float_memory(speaker_encoder.Qwen3TTSSpeakerEncoder(settings))
        tokenizer = open_checkpoint(ckpt.path / TOKENIZER).config  # its config.json only
        if name in ("code2wav", code2wav_stream.COMPONENT):  # the same weights, each its engine
            settings = code2wav.decoder_settings(tokenizer.get("decoder_config"))
            return float_memory(folded_code2wav(code2wav.Qwen3TTSCode2Wav(settings)))
        if name == "speech_tokenizer_encoder":
            encoder = speech_encoder.Qwen3TTSSpeechEncoder(tokenizer)
            return float_memory(folded_speech_encoder(encoder))
    raise ValueError(f"qwen3_tts has no component {name!r}")


def folded_code2wav(module: code2wav.Qwen3TTSCode2Wav) -> code2wav.Qwen3TTSCode2Wav:
    """Each codebook (``embedding_sum`` [size, dim], ``cluster_usage`` [size]) as the one table
    [size, dim] its lookup reads (code2wav._Codebook.forward). In place; returns the module."""
    q = module.quantizer
    for group in (q.rvq_first, q.rvq_rest):
        for layer in group.vq.layers:
            book = layer._codebook
            fold(book, {"table": tuple(book.embedding_sum.shape)})
    return module


def folded_speech_encoder(
    module: speech_encoder.Qwen3TTSSpeechEncoder,
) -> speech_encoder.Qwen3TTSSpeechEncoder:
    """Each codebook (``embed_sum`` [size, dim], ``cluster_usage``, ``initialized``) as the
    tables its search reads (speech_encoder._rvq_encode): the right-hand side of _nearest's
    distance matmul, [e, 1, |e|^2] transposed to [dim + 2, size], and the table [size, dim]
    whose picked rows leave the residual, but for a group's last codebook, whose residual is
    never read. In place; returns the module."""
    for rvq in module._groups():
        last = len(rvq.layers) - 1
        for i, layer in enumerate(rvq.layers):
            size, dim = (int(d) for d in layer.codebook.embed_sum.shape)
            stored = {"search": (dim + 2, size)}
            if i < last:
                stored["table"] = (size, dim)
            fold(layer.codebook, stored)
    return module
