"""runtime/requests.py: request files in, predictions out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeomni.runtime.predictions import write_json_atomic, write_predictions
from edgeomni.runtime.requests import (
    BadRequest,
    Request,
    load_request_file,
    parse_request_file,
    parse_sampling,
)
from edgeomni.runtime.sampling import SamplingParams

GOOD: dict[str, Any] = {
    "batch_size": 2,
    "temperature": 0.6,
    "top_k": 20,
    "sampling_seed": 11,
    "max_generate_length": 64,
    "enable_thinking": True,
    "talker_temperature": 0.8,
    "requests": [
        {"messages": [{"role": "user", "content": "Hi"}]},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "audio", "audio": "q.wav"},
                        {"type": "text", "text": "Answer this."},
                    ],
                },
            ],
            "max_generate_length": 8,
            "sampling": {"top_k": 5, "seed": 3, "talker_temperature": 0.5, "cp_top_k": 10},
            "voice": "Ethan",
            "stop": ["\n\n"],
        },
        {"prompt": "Describe", "speaker": "Chelsie"},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]},
    ],
}


def _only_request(obj: dict[str, Any]) -> Request | BadRequest:
    entries, _ = parse_request_file(obj)
    assert len(entries) == 1
    return entries[0]


def test_good_file_precedence_cli_file_request() -> None:
    cli = SamplingParams(temperature=0.9, top_p=0.7, repetition_penalty=1.1)
    entries, settings = parse_request_file(
        GOOD, cli, {"talker_temperature": 0.1, "talker_top_k": 4}
    )
    assert all(isinstance(e, Request) for e in entries)
    r0, r1, r2, r3 = entries
    assert isinstance(r0, Request) and isinstance(r1, Request)
    assert isinstance(r2, Request) and isinstance(r3, Request)
    assert [e.index for e in entries] == [0, 1, 2, 3]
    # CLI < file: the file overrides temperature/top_k/seed, the CLI's top_p and penalty stay.
    assert r0.sampling == SamplingParams(
        temperature=0.6, top_k=20, top_p=0.7, repetition_penalty=1.1, seed=11
    )
    # file < request.
    assert r1.sampling == SamplingParams(
        temperature=0.6, top_k=5, top_p=0.7, repetition_penalty=1.1, seed=3
    )
    assert dict(r0.stage_settings) == {"talker_temperature": 0.8, "talker_top_k": 4}
    assert dict(r1.stage_settings) == {
        "talker_temperature": 0.5,
        "talker_top_k": 4,
        "cp_top_k": 10,
    }
    assert (r0.max_generate_length, r1.max_generate_length) == (64, 8)
    assert r0.enable_thinking and r0.apply_chat_template and r0.add_generation_prompt
    assert r1.stop == ("\n\n",) and r0.stop == ()
    assert r1.voice == "Ethan" and r2.voice == "Chelsie" and r0.voice is None
    assert r0.fields == {"messages"}
    assert r1.fields == {"messages", "audio", "voice"}
    assert r2.fields == {"messages", "voice"}
    assert r3.fields == {"messages", "image"}
    assert r2.messages == ({"role": "user", "content": "Describe"},)
    assert r1.messages[1]["content"][0] == {"type": "audio", "audio": "q.wav"}
    assert settings["batch_size"] == 2
    assert r0.batch_settings != r1.batch_settings
    hash(r0.batch_settings)  # usable in a cohort key


def test_defaults_without_overrides() -> None:
    r = _only_request({"requests": [{"prompt": "x"}]})
    assert isinstance(r, Request)
    assert r.sampling == SamplingParams()
    assert r.max_generate_length == 256
    assert (r.apply_chat_template, r.add_generation_prompt, r.enable_thinking) == (
        True,
        True,
        False,
    )
    assert dict(r.stage_settings) == {}


def test_parsed_messages_are_copies() -> None:
    obj = {
        "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}]
    }
    r = _only_request(obj)
    obj["requests"][0]["messages"][0]["content"][0]["text"] = "changed"
    assert isinstance(r, Request)
    assert r.messages[0]["content"][0]["text"] == "a"


BAD_REQUESTS: list[tuple[Any, str]] = [
    ({}, "no messages"),
    ({"messages": "hello"}, "messages must be a list"),
    ({"messages": []}, "empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role must be one of"),
    ({"messages": [{"role": "user"}]}, "no content"),
    ({"messages": [{"role": "user", "content": 5}]}, "content must be a string or a list"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": "v"}]}]}, "type must"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "audio must be"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "text must be"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "unknown keys"),
    ({"prompt": "x", "sampling": {"temprature": 0.5}}, "temperature, top_k"),
    ({"prompt": "x", "sampling": {"top_p": 0}}, "top_p"),
    ({"prompt": "x", "sampling": {"talker_top_k": -2}}, "talker_top_k"),
    ({"prompt": "x", "sampling": {"talker_x": "a"}}, "unknown speech-stage key ['talker_x']"),
    ({"prompt": "x", "sampling": {"talker_top_kk": 3}}, "did you mean 'talker_top_kk' -> 'talker_top_k'?"),
    ({"prompt": "x", "sampling": {"talker_do_sample": "no"}}, "talker_do_sample must be a number"),
    ({"prompt": "x", "sampling": 0.5}, "sampling must be an object"),
    ({"prompt": "x", "max_generate_length": 0}, "max_generate_length"),
    ({"prompt": "x", "min_generate_length": -1}, "min_generate_length must be an integer >= 0"),
    ({"prompt": "x", "max_generate_length": 4, "min_generate_length": 5}, "exceeds"),
    ({"prompt": "x", "sampling": {"talker_min_new_tokens": 1.5}}, "talker_min_new_tokens"),
    ({"prompt": "x", "sampling": {"talker_max_new_tokens": 0}}, "talker_max_new_tokens"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "voice": ""}, "voice"),
    ({"prompt": "x", "voice": "a", "speaker": "b"}, "disagree"),
    ({"prompt": "x", "lora_name": "l"}, "lora_name: LoRA adapters are not supported"),
    ({"prompt": "x", "guided_decoding": {"choice": ["a"]}}, "guided decoding is not supported"),
    ({"prompt": "x", "refrence": "y"}, "did you mean 'refrence' -> 'reference'?"),
    ({"prompt": "x", "logit_bias": {"abc": 1.0}}, "logit_bias key 'abc' must be a token id"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "within [-100, 100]"),
    ({"prompt": "x", "logit_bias": {"5": "a"}}, "must be a finite number"),
    ({"prompt": "x", "logit_bias": {"5": 1, "05": 2}}, "names token 5 twice"),
    ({"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}}, "at most 1024"),
    ({"prompt": "x", "logit_bias": [1]}, "logit_bias must be an object"),
    ({"prompt": "x", "num_logprobs": 51}, "num_logprobs must be an integer in [0, 50]"),
    ({"prompt": "x", "num_logprobs": True}, "num_logprobs"),
    ({"prompt": "x", "max_audio_length": 0}, "max_audio_length must be an integer >= 1"),
    ({"prompt": "x", "max_audio_length": 5, "talker_max_new_tokens": 6}, "unknown request keys"),
    ({"prompt": "x", "language": 3}, "language must be a string"),
    ({"prompt": "x", "prompt_speaker_codes": [[1, "a"]]}, "prompt_speaker_codes must be"),
    ({"prompt": "x", "disable_spec_decode": "yes"}, "disable_spec_decode must be true or false"),
    ({"prompt": "x", "sampling_seed": 3, "sampling": {"seed": 4}}, "disagree"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": "a.png", "do_resize": "no"}],
                }
            ]
        },
        "do_resize must be",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "audio", "audio": "a.wav", "do_resize": False}],
                }
            ]
        },
        "audio part",
    ),
    ({"prompt": "x", "temperature": 0.5}, "go in the 'sampling' object"),
    ({"prompt": "x", "messages": []}, "not both"),
    ({"prompt": ["x"]}, "prompt must be a string"),
    ("just text", "must be an object"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_REQUESTS)
def test_bad_request_is_isolated(bad: Any, message: str) -> None:
    good = {"prompt": "fine"}
    entries, _ = parse_request_file({"requests": [good, bad, good]})
    assert isinstance(entries[0], Request) and isinstance(entries[2], Request)
    assert entries[2].index == 2
    bad_entry = entries[1]
    assert isinstance(bad_entry, BadRequest)
    assert bad_entry.index == 1
    assert message in bad_entry.error


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "must be a JSON object"),
        ({}, "'requests' list"),
        ({"requests": {"a": 1}}, "'requests' list"),
        ({"requests": [], "temperature": -1}, "temperature"),
        ({"requests": [], "batch_size": 0}, "batch_size"),
        ({"requests": [], "apply_chat_template": "yes"}, "apply_chat_template"),
        ({"requests": [], "talker_top_p": 3}, "talker_top_p"),
        ({"requests": [], "num_logprob": 2}, "did you mean 'num_logprob' -> 'num_logprobs'?"),
        ({"requests": [], "num_logprobs": 99}, "top level: num_logprobs"),
        ({"requests": [], "logit_bias": {"x": 1}}, "top level: logit_bias key"),
        ({"requests": [], "max_audio_length": 4, "talker_max_new_tokens": 5}, "disagree"),
        ({"requests": [], "stop": [""]}, "top level: stop"),
    ],
)
def test_bad_file_raises(obj: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_request_file(obj)


def test_bad_cli_extra_defaults_raise() -> None:
    with pytest.raises(ValueError, match="sampling defaults: talker_temperature"):
        parse_request_file({"requests": []}, extra_defaults={"talker_temperature": -1})


def test_parse_sampling_for_cli() -> None:
    params, extra = parse_sampling({"temperature": 0.7, "talker_temperature": 0.9})
    assert params.temperature == 0.7 and extra == {"talker_temperature": 0.9}
    with pytest.raises(ValueError, match="accepted"):
        parse_sampling({"temp": 1})


def test_load_request_file(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(GOOD), encoding="utf-8")
    entries, settings = load_request_file(path)
    assert len(entries) == 4 and settings["batch_size"] == 2
    path.write_text('{"requests": [\n  {"prompt": "a"},\n  oops\n]}', encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 column 3"):
        load_request_file(path)
    path.write_text('{"requests": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="req.json"):
        load_request_file(path)


@pytest.mark.parametrize(
    ("text", "where"),
    [('{"requests": [{"prompt": "a"}], "requests": [{"prompt": "b"}]}', "top level: the key 'requests'"),
     ('{"requests": [{"prompt": "a", "top_k": 1, "top_k": 5}]}', "requests[0]: the key 'top_k'"),
     ('{"requests": [{"prompt": "a", "reference": {"x": [{"y": 1, "y": 2}]}}], "top_k": 1}',
      "requests[0].reference.x[0]: the key 'y'")],
)  # fmt: skip
def test_a_key_given_twice_is_refused_where_it_is(tmp_path: Path, text: str, where: str) -> None:
    """JSON would keep the last of a key given twice, unsaid: the file is refused instead."""
    path = tmp_path / "req.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"req.json: {where} is given more than once")):
        load_request_file(path)


def test_write_json_atomic_replaces_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "predictions.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "text": "héllo"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2, "text": "héllo"}
    assert os.listdir(tmp_path) == ["predictions.json"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_write_json_atomic_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "predictions.json"
    write_json_atomic(path, {"responses": [{"request_idx": 0}]})
    before = path.read_bytes()
    # Serialisation fails part-way: a large valid prefix is written before the bad object.
    obj = {"responses": [{"request_idx": i, "text": "x" * 100} for i in range(500)] + [object()]}
    with pytest.raises(TypeError):
        write_json_atomic(path, obj)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["predictions.json"]
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "new.json", {"x": {1, 2}})
    assert os.listdir(tmp_path) == ["predictions.json"]


def test_write_predictions(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    entries = [
        {"request_idx": 0, "ok": True, "error": None, "output_text": "hi"},
        {"request_idx": 1, "ok": False, "error": "bad role"},
    ]
    write_predictions(path, entries, tmp_path / "in.json")
    want = {"input_file": str(tmp_path / "in.json"), "responses": entries}
    assert json.loads(path.read_text(encoding="utf-8")) == want
    with pytest.raises(ValueError, match="lacks ok"):
        write_predictions(path, [{"request_idx": 0, "error": None}])
    with pytest.raises(ValueError, match="input order"):
        write_predictions(path, list(reversed(entries)))
    assert json.loads(path.read_text(encoding="utf-8")) == want
    write_predictions(path, entries)  # a --prompt run has no input file
    assert json.loads(path.read_text(encoding="utf-8"))["input_file"] is None


def test_runtime_modules_import_only_stdlib_and_numpy() -> None:
    # The board has no torch: importing these modules must not pull it in.
    code = (
        "import sys; import edgeomni.runtime.requests, edgeomni.runtime.scheduler; "
        "bad = sorted(m for m in ('torch', 'transformers') if m in sys.modules); "
        "assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_min_generate_length_from_the_file_and_per_request() -> None:
    entries, settings = parse_request_file(
        {
            "min_generate_length": 3,
            "requests": [{"prompt": "a"}, {"prompt": "b", "min_generate_length": 0}],
        }  # fmt: skip
    )
    assert [e.min_generate_length for e in entries] == [3, 0]
    assert settings["min_generate_length"] == 3
    (entry,), _ = parse_request_file({"requests": [{"prompt": "c"}]})
    assert entry.min_generate_length == 0


# TensorRT Edge-LLM's llm_inference request file, as its input-format guide writes it
UPSTREAM: dict[str, Any] = {
    "_comment": "keys starting with _ are comments",
    "batch_size": 1,
    "temperature": 1.0,
    "top_p": 0.8,
    "top_k": 50,
    "sampling_seed": 123456789,
    "spec_proposal_sampling": "auto",
    "logit_bias": {"123": -100.0},
    "max_generate_length": 256,
    "num_logprobs": 0,
    "apply_chat_template": True,
    "enable_thinking": False,
    "context_cache_lookup_policy": "use_cache",
    "context_cache_commit_policy": "including_generated_tokens",
    "available_lora_weights": {},
    "save_system_prompt_kv_cache": False,
    "disable_spec_decode": False,
    "diffusion_config": {"steps": 8},
    "streaming": {"enable": True, "codec_chunk_frames": 10, "talker_prefill_threshold": 4},
    "max_audio_length": 300,
    "stop": ["###"],
    "requests": [
        {
            "_scenario": "basic",
            "messages": [{"role": "user", "content": "Your message here", "_note": "n"}],
            "disable_spec_decode": False,
            "logit_bias": {"456": 5.0},
            "num_logprobs": 3,
            "stop": ["optional_stop_string"],
            "reference": "the expected answer",
        },
        {"messages": [{"role": "user", "content": "Hi"}], "lora_name": "french"},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": "pre.png", "do_resize": False, "_c": 1},
                        {"type": "audio", "audio": "clip.flac"},
                        {"type": "text", "text": "Describe."},
                    ],
                }
            ],
            "sampling_seed": 7,
            "max_audio_length": 12,
            "speaker": "ethan",
            "language": "English",
            "ref_text": "",
        },
    ],
}


def test_upstream_keys_are_known_and_do_what_the_table_says() -> None:
    entries, settings = parse_request_file(UPSTREAM)
    r0, r1, r2 = entries
    assert isinstance(r0, Request) and isinstance(r2, Request)
    # features edgeomni lacks: reported once, changing nothing
    assert sorted(settings["ignored"]) == [
        "available_lora_weights", "context_cache_commit_policy", "context_cache_lookup_policy",
        "diffusion_config", "disable_spec_decode", "save_system_prompt_kv_cache",
        "spec_proposal_sampling", "streaming",
    ]  # fmt: skip
    # a request that needs LoRA fails alone, saying so
    assert isinstance(r1, BadRequest) and "LoRA adapters are not supported" in r1.error
    assert r1.messages == [{"role": "user", "content": "Hi"}]
    # per-request logit_bias and num_logprobs replace the top level's
    assert r0.logit_bias == ((456, 5.0),) and r0.num_logprobs == 3
    assert r2.logit_bias == ((123, -100.0),) and r2.num_logprobs == 0
    assert r0.stop == ("optional_stop_string",) and r2.stop == ("###",)
    assert dict(r0.carry) == {"reference": "the expected answer"} and not r2.carry
    # max_audio_length is the talker's frame cap
    assert r0.stage_settings["talker_max_new_tokens"] == 300
    assert r2.stage_settings["talker_max_new_tokens"] == 12
    assert r0.sampling.seed == 123456789 and r2.sampling.seed == 7
    # speech keys are request fields; an empty string is "not given"
    assert dict(r2.speech) == {"language": "English"}
    assert r2.fields == {"messages", "image", "audio", "voice", "language"}
    assert r2.messages[0]["content"][0] == {"type": "image", "image": "pre.png",
                                            "do_resize": False}  # fmt: skip
    assert settings["fallbacks"] == {}


def test_top_level_guided_decoding_fails_every_request() -> None:
    entries, _ = parse_request_file(
        {"guided_decoding": {"regex": "a+"}, "requests": [{"prompt": "a"}, {"prompt": "b"}]}
    )
    assert all(isinstance(e, BadRequest) and "guided decoding" in e.error for e in entries)


def test_repetition_penalty_meaning_is_flagged() -> None:
    _, settings = parse_request_file({"repetition_penalty": 1.1, "requests": []})
    assert settings["fallbacks"] == {"repetition_penalty": "talker_repetition_penalty"}
    _, settings = parse_request_file(
        {"repetition_penalty": 1.1, "talker_repetition_penalty": 1.05, "requests": []}
    )
    assert settings["fallbacks"] == {}


def _readme_request_section() -> str:
    text = (Path(__file__).parents[1] / "README.md").read_text()
    start = text.index("### Request files")
    return text[start : text.index("\n## ", start)]


def test_readme_lists_every_request_file_key() -> None:
    from edgeomni.runtime.requests import FILE_KEYS, REQUEST_KEYS

    section = _readme_request_section()
    missing = [k for k in (*FILE_KEYS, *REQUEST_KEYS) if f"`{k}`" not in section]
    assert not missing, f"README's request-file section lacks {missing}"
