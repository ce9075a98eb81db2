"""TensorRT Edge-LLM's own request files run as they are, and predictions.json carries
llm_inference's fields (issue 15): an LLM file with upstream's keys (logit_bias against
transformers' sequence_bias, logprobs against transformers' logits, a LoRA request failing
alone), a VLM request with a JPEG and a pre-resized PNG (on Qwen3-Omni and Qwen3-VL), ASR with
FLAC and MP3 (on Qwen3-Omni and on Qwen3-ASR), and an omni file that speaks, each entry's fields
and types checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeomni.runtime import cli
from edgeomni.runtime.safetensors_np import load

MAX_NEW = 12
FINISH = {"end-of-sequence", "stop-words", "max-length", "error", "cancelled"}


@pytest.fixture(scope="module")
def hf(qwen3_ckpt: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen3_ckpt, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(qwen3_ckpt)


def hf_generate(hf, messages: list[dict], **kw: Any) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy tokens and each step's raw logits."""
    model, tok = hf
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=MAX_NEW, do_sample=False, output_logits=True,
            return_dict_in_generate=True, **kw,
        )  # fmt: skip
    return out.sequences[0, ids.shape[1] :].tolist(), [x[0].numpy() for x in out.logits]


def run(engine: Path, tmp: Path, body: dict, *flags: str) -> tuple[int, dict]:
    (tmp / "req.json").write_text(json.dumps(body))
    code = cli.main(
        ["--config", str(engine), "--input-file", str(tmp / "req.json"),
         "--output-file", str(tmp / "pred.json"), *flags]
    )  # fmt: skip
    return code, json.loads((tmp / "pred.json").read_text())


def check_entry(entry: dict, idx: int) -> None:
    """The llm_inference fields every entry has, with their types."""
    assert entry["request_idx"] == idx
    assert entry["batch_idx"] is None or isinstance(entry["batch_idx"], int)
    assert isinstance(entry["output_text"], str)
    assert entry["finish_reason"] in FINISH
    assert isinstance(entry["messages"], list)
    for m in entry["messages"]:
        assert set(m) == {"role", "content"} and isinstance(m["content"], list)
        assert all(isinstance(p, dict) and "type" in p for p in m["content"])
    assert isinstance(entry["formatted_system_prompt"], str)
    assert isinstance(entry["formatted_complete_request"], str)
    assert isinstance(entry["ok"], bool) and isinstance(entry["stages"], dict)
    assert (entry["finish_reason"] == "error") == (not entry["ok"])
    if not entry["ok"]:
        assert entry["output_text"] == entry["error"]


def test_llm_file_in_upstream_format(qwen3_engine: Path, hf, tmp_path: Path, capsys) -> None:
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is machine learning?"}
    plain, logits = hf_generate(hf, [user])
    # a bias that bans the first token transformers picks and raises another, with a penalty
    # applied after it (Hugging Face's order)
    banned, raised = plain[0], (plain[0] + 7) % hf[0].config.vocab_size
    biased, _ = hf_generate(
        hf, [system, user], sequence_bias=[[[banned], -100.0], [[raised], 3.0]],
        repetition_penalty=1.3,
    )  # fmt: skip
    body = {
        "_comment": "llm_inference's input-format example, with every key class",
        "batch_size": 3,
        "temperature": 1.0, "top_p": 0.8, "top_k": 1, "sampling_seed": 123456789,
        "spec_proposal_sampling": "auto",
        "max_generate_length": MAX_NEW,
        "num_logprobs": 0,
        "apply_chat_template": True, "enable_thinking": False,
        "context_cache_lookup_policy": "use_cache",
        "context_cache_commit_policy": "including_generated_tokens",
        "available_lora_weights": {"french": "/nowhere/french.safetensors"},
        "requests": [
            {"_scenario": "logprobs", "messages": [user], "num_logprobs": 5,
             "disable_spec_decode": False, "reference": "A field of AI."},
            {"messages": [system, user], "sampling": {"repetition_penalty": 1.3},
             "logit_bias": {str(banned): -100.0, str(raised): 3.0}},
            {"messages": [user], "lora_name": "french"},
        ],
    }  # fmt: skip
    code, pred = run(qwen3_engine, tmp_path, body)
    err = capsys.readouterr().err
    assert code == cli.EXIT_REQUESTS_FAILED  # the LoRA request, alone
    for key in ("available_lora_weights", "context_cache_lookup_policy",
                "context_cache_commit_policy", "spec_proposal_sampling"):  # fmt: skip
        assert f"ignoring the request file's {key}" in err
    assert pred["input_file"] == str(tmp_path / "req.json")
    e0, e1, e2 = pred["responses"]
    for i, e in enumerate(pred["responses"]):
        check_entry(e, i)

    # request 0: transformers' tokens, and its logprobs are log_softmax of its logits
    assert e0["ok"] and e0["stages"]["llm"]["output_tokens"] == plain
    assert e0["finish_reason"] in ("end-of-sequence", "max-length")
    assert e0["reference"] == "A field of AI."
    assert len(e0["logprobs"]) == len(plain)
    for step, (cands, row) in enumerate(zip(e0["logprobs"], logits, strict=True)):
        lp = torch.log_softmax(torch.from_numpy(row).double(), -1).numpy()
        top = np.argsort(-lp, kind="stable")[:5]
        assert [c["token_id"] for c in cands] == top.tolist(), step
        np.testing.assert_allclose([c["logprob"] for c in cands], lp[top], atol=1e-4)
        assert cands[0]["token_id"] == plain[step]
        for c in cands:
            assert set(c) == {"token_id", "token", "bytes", "logprob"}
            assert bytes(c["bytes"]).decode("utf-8", "replace") == c["token"]
    text = b"".join(bytes(c[0]["bytes"]) for c in e0["logprobs"] if c[0]["token_id"] in plain)
    assert e0["output_text"] in text.decode("utf-8", "replace")
    tok = hf[1]
    assert e0["formatted_complete_request"] == tok.apply_chat_template(
        [user], tokenize=False, add_generation_prompt=True
    )
    assert e0["formatted_system_prompt"] == ""
    assert e0["messages"] == [{"role": "user", "content": [{"type": "text",
                                                             "text": user["content"]}]}]  # fmt: skip

    # request 1: logit_bias (and the penalty after it) as transformers' sequence_bias
    assert e1["ok"] and e1["stages"]["llm"]["output_tokens"] == biased
    assert "logprobs" not in e1 and "reference" not in e1
    assert e1["formatted_system_prompt"] == tok.apply_chat_template(
        [system], tokenize=False, add_generation_prompt=False
    )
    assert e1["formatted_complete_request"].startswith(e1["formatted_system_prompt"])
    assert e0["batch_idx"] != e1["batch_idx"] or e0["stages"]["llm"]["cohort_size"] == 1

    # request 2 needs LoRA: it fails alone, as upstream writes a failure
    assert not e2["ok"] and e2["finish_reason"] == "error"
    assert "LoRA adapters are not supported" in e2["output_text"]
    assert e2["batch_idx"] is None


def test_stop_strings_and_finish_reasons(qwen3_engine: Path, hf, tmp_path: Path) -> None:
    user = {"role": "user", "content": "Hello! How are you today?"}
    plain, _ = hf_generate(hf, [user])
    stop = hf[1].decode(plain[2:4])
    assert stop.strip()
    body = {"top_k": 1, "max_generate_length": MAX_NEW, "stop": [stop],
            "requests": [{"messages": [user]}, {"messages": [user], "stop": []}]}  # fmt: skip
    code, pred = run(qwen3_engine, tmp_path, body)
    assert code == cli.EXIT_OK
    first, second = pred["responses"]
    assert first["finish_reason"] == "stop-words" and stop not in first["output_text"]
    assert second["finish_reason"] in ("end-of-sequence", "max-length")
    assert second["stages"]["llm"]["output_tokens"] == plain


def test_a_logit_bias_outside_the_vocabulary_fails_alone(qwen3_engine: Path, tmp_path: Path):
    body = {
        "top_k": 1,
        "max_generate_length": 2,
        "requests": [{"prompt": "a", "logit_bias": {"99999999": 1}}, {"prompt": "b"}],
    }
    code, pred = run(qwen3_engine, tmp_path, body)
    assert code == cli.EXIT_REQUESTS_FAILED
    bad, good = pred["responses"]
    assert "logit_bias names token 99999999" in bad["error"] and good["ok"]
    check_entry(bad, 0)


@pytest.fixture(scope="module")
def media_files(tmp_path_factory) -> dict[str, Path]:
    """One clip as WAV, FLAC (the same 16-bit samples) and MP3; a JPEG; a PNG already at the
    model's target size (64x96: multiples of 32 within the pixel bounds) and one that is not."""
    import soundfile as sf

    PIL = pytest.importorskip("PIL", reason="image files are read with Pillow")
    from PIL import Image

    assert PIL
    folder = tmp_path_factory.mktemp("upstream-media")
    rng = np.random.default_rng(1)
    t = np.arange(24000) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    files = {k: folder / f"clip.{k}" for k in ("wav", "flac", "mp3")}
    sf.write(files["wav"], wave, 16000, subtype="PCM_16")
    sf.write(files["flac"], wave, 16000, subtype="PCM_16")
    sf.write(files["mp3"], wave, 16000, format="MP3")
    image = (rng.random((64, 96, 3)) * 255).astype(np.uint8)
    files["jpeg"] = folder / "photo.jpeg"
    Image.fromarray(image).save(files["jpeg"], quality=90)
    files["png"] = folder / "sized.png"
    Image.fromarray(image).save(files["png"])
    files["odd"] = folder / "odd.png"
    Image.fromarray(image[:60]).save(files["odd"])
    return files


def _part(kind: str, path: Path, text: str, **opts: Any) -> dict:
    content = [{"type": kind, kind: str(path), **opts}, {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}]}


def test_vlm_and_asr_requests_in_upstream_format(
    omni_engine: Path, media_files: dict[str, Path], tmp_path: Path
) -> None:
    f = media_files
    body = {
        "top_k": 1, "max_generate_length": 4, "batch_size": 3,
        "requests": [
            _part("image", f["jpeg"], "Describe this image."),
            _part("image", f["png"], "Describe this image."),
            _part("image", f["png"], "Describe this image.", do_resize=False),
            _part("image", f["odd"], "Describe this image.", do_resize=False),
            _part("audio", f["wav"], "Transcribe."),
            _part("audio", f["flac"], "Transcribe."),
            _part("audio", f["mp3"], "Transcribe."),
            {"prompt": "Say hi.", "language": "English"},
        ],
    }  # fmt: skip
    code, pred = run(omni_engine, tmp_path, body)
    assert code == cli.EXIT_REQUESTS_FAILED
    out = pred["responses"]
    for i, e in enumerate(out):
        check_entry(e, i)
    ok = [e["ok"] for e in out]
    assert ok == [True, True, True, False, True, True, True, False], [e["error"] for e in out]
    tokens = [e["stages"].get("thinker", {}).get("output_tokens") for e in out]
    # a pre-resized image read as it is gives what resizing it to its own size gives
    assert tokens[2] == tokens[1]
    assert out[2]["messages"][0]["content"][0]["do_resize"] is False
    assert "must be the model's target size for it, 96x64" in out[3]["error"]
    assert "it is 96x60" in out[3]["error"]
    # FLAC holds the WAV's samples: the same answer
    assert tokens[5] == tokens[4]
    assert "language: no stage of this graph reads it" in out[7]["error"]
    # these text-only media requests ran in-flight; fixed cohorts give the same tokens
    code, again = run(omni_engine, tmp_path, body, "--batching", "cohort")
    assert [e["stages"].get("thinker", {}).get("output_tokens") for e in again["responses"]] == (
        tokens
    )


def test_vlm_requests_in_upstream_format_on_qwen3_vl(
    vl_engine: Path, media_files: dict[str, Path], tmp_path: Path
) -> None:
    """llm_inference's VLM file on the Qwen3-VL graph: every request answered (a JPEG, a PNG,
    a pre-resized one, two images in one turn, a system prompt, text only, upstream's
    ``reference`` key), in flight and in fixed cohorts alike."""
    f = media_files
    two = _part("image", f["jpeg"], "Compare them.")
    two["messages"][0]["content"].insert(1, {"type": "image", "image": str(f["png"])})
    system = _part("image", f["png"], "What is in it?")
    system["messages"].insert(0, {"role": "system", "content": "You describe images."})
    body = {
        "top_k": 1, "max_generate_length": 4, "batch_size": 3,
        "requests": [
            _part("image", f["jpeg"], "Describe this image."),
            _part("image", f["png"], "Describe this image.", do_resize=False),
            two, system,
            {"messages": [{"role": "user", "content": "Say hi."}], "reference": "Hi!"},
            _part("image", f["png"], "Describe this image."),
        ],
    }  # fmt: skip
    code, pred = run(vl_engine, tmp_path, body)
    out = pred["responses"]
    assert code == 0, [e["error"] for e in out]
    for i, e in enumerate(out):
        check_entry(e, i)
        assert e["ok"] and e["stages"]["llm"]["output_tokens"], e
    tokens = [e["stages"]["llm"]["output_tokens"] for e in out]
    assert tokens[1] == tokens[5]  # the pre-resized PNG read as it is, or resized to itself
    code, again = run(vl_engine, tmp_path, body, "--batching", "cohort")
    assert code == 0 and [e["stages"]["llm"]["output_tokens"] for e in again["responses"]] == (
        tokens
    )


def test_asr_requests_in_upstream_format(
    asr_engine: Path, media_files: dict[str, Path], tmp_path: Path
) -> None:
    """Upstream's ASR requests (a clip as WAV, FLAC and MP3 with an instruction) on the
    Qwen3-ASR graph, with a forced language and a text-only request beside them: every request
    answered, each entry with its parsed language and transcript, in flight as in cohorts."""
    f = media_files
    body = {
        "top_k": 1, "max_generate_length": 6, "batch_size": 3,
        "requests": [
            _part("audio", f["wav"], "Transcribe."),
            _part("audio", f["flac"], "Transcribe."),
            _part("audio", f["mp3"], "Transcribe."),
            {**_part("audio", f["wav"], ""), "language": "en"},
            {"prompt": "Say hi."},
        ],
    }  # fmt: skip
    code, pred = run(asr_engine, tmp_path, body)
    assert code == cli.EXIT_OK
    out = pred["responses"]
    for i, e in enumerate(out):
        check_entry(e, i)
        assert isinstance(e["transcript"], str) and "language" in e
    tokens = [e["stages"]["llm"]["output_tokens"] for e in out]
    assert tokens[1] == tokens[0]  # FLAC holds the WAV's samples
    assert out[3]["language"] == "English"
    assert out[3]["formatted_complete_request"].endswith("language English<asr_text>")
    code, again = run(asr_engine, tmp_path, body, "--batching", "cohort")
    assert [e["stages"]["llm"]["output_tokens"] for e in again["responses"]] == tokens


def test_omni_file_that_speaks(omni_engine: Path, tmp_path: Path, capsys) -> None:
    body = {
        "top_k": 1, "talker_top_k": 1, "max_generate_length": 6, "repetition_penalty": 1.1,
        "speaker": "ethan", "max_audio_length": 9,
        "streaming": {"enable": True, "codec_chunk_frames": 10, "talker_prefill_threshold": 4},
        "requests": [{"messages": [{"role": "user", "content": "Hello"}]},
                     {"prompt": "Hi", "max_audio_length": 5}],
    }  # fmt: skip
    audio = tmp_path / "audio"
    code, pred = run(omni_engine, tmp_path, body, "--output-audio-dir", str(audio))
    assert code == cli.EXIT_OK
    err = capsys.readouterr().err
    assert "ignoring the request file's streaming" in err
    assert "repetition_penalty applies to the text model here" in err
    caps = (9, 5)
    for i, e in enumerate(pred["responses"]):
        check_entry(e, i)
        assert e["audio_file"] == str(audio / f"audio_req{i}.wav")
        assert isinstance(e["audio_samples"], int) and e["audio_samples"] > 0
        assert e["audio_sample_rate"] == 24000
        assert isinstance(e["audio_duration_ms"], int)
        assert e["audio_duration_ms"] == round(1000 * e["audio_samples"] / 24000)
        tensors = load(e["rvq_file"])
        assert list(tensors) == ["rvq_codes"]
        codes = np.asarray(tensors["rvq_codes"])
        assert codes.dtype == np.int32 and codes.ndim == 2
        assert 0 < codes.shape[0] <= caps[i]
        assert codes.shape[0] == e["stages"]["talker"]["frames"]


def test_a_graph_in_upstream_form_runs(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    """upstream's graph fields (an emit's binding, a stage's stream lane, no transport, the
    artifact "" for the graph's own dir) are accepted; the graph's max_batch caps a cohort;
    a transport nobody knows is refused with its JSON path."""
    import shutil

    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    graph = json.loads((eng / "multistage_config.json").read_text())
    stage = graph["stages"][0]
    stage.update(artifact="", stream=0, max_batch=1)
    for emit in stage["emits"]:
        emit.pop("transport")
        emit["binding"] = "output_text"
    (eng / "multistage_config.json").write_text(json.dumps(graph))
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_OK
    body = {"top_k": 1, "max_generate_length": 3, "batch_size": 3,
            "requests": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]}  # fmt: skip
    code, pred = run(eng, tmp_path, body)
    assert code == cli.EXIT_OK
    assert [e["stages"]["llm"]["cohort_size"] for e in pred["responses"]] == [1, 1, 1]
    assert [e["batch_idx"] for e in pred["responses"]] == [0, 0, 0]
    stage["emits"][0]["transport"] = "bogus"
    (eng / "multistage_config.json").write_text(json.dumps(graph))
    capsys.readouterr()
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_BAD_CONFIG
    assert "$.stages[0].emits[0].transport: unknown transport 'bogus'" in capsys.readouterr().err
