"""edge-infer's bad inputs and faults, as one table.

Each row is a command on a copy of a tiny build: the exit status it must give, a fragment of its
message, whether any stage was opened (nothing is loaded before the flags, the request file and
the destinations are checked), and what it may write: everything else on disk must be byte for
byte as it was. Exit 2 rows print one ``edge-infer: error:`` line and never a traceback; exit 3
rows write predictions in which only the bad request fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from infer_fault_cases import (  # the rows' setups and checks
    GRAPH,
    OMNI_SPOKE,
    Row,
    World,
    a_bug,
    another_engine_dir,
    audio_dir_over_input,
    bad_media,
    disk_full,
    escaped_echo,
    escaped_reference,
    foreign,
    greedy_talker,
    inject_engine_fault,
    interrupted_after_first,
    mixed,
    mixed_file,
    no_tts_special,
    omni_talker_params,
    one_fails,
    penalty_is,
    predictions,
    printed_predictions,
    raising_template,
    random_bytes,
    reference_kept,
    relabel_text_emit,
    signal_in_cohort,
    signal_while_loading,
    truncate,
    truncate_data,
    tts_file,
    voices_of_requests,
    with_external_data,
    with_media,
    written_through_the_link,
)

from edgeomni.runtime import cli
from edgeomni.runtime.pipeline import Pipeline

BAD_USAGE, BAD_REQUEST = cli.EXIT_BAD_CONFIG, cli.EXIT_REQUESTS_FAILED
ROWS = [
    # -- flags, checked before anything is read
    Row("no-request", lambda w: ["--config", str(w.eng)], BAD_USAGE, "give --prompt"),
    Row("threads-above-the-cores", lambda w: w.prompt("--threads", "100000"), BAD_USAGE,
        "--threads 100000 is more than the"),
    Row("threads-negative", lambda w: w.prompt("--threads", "-3"), BAD_USAGE,
        "--threads must be at least 1, got -3"),
    Row("vocoder-threads-zero", lambda w: w.prompt("--vocoder-threads", "0"), BAD_USAGE,
        "--vocoder-threads must be at least 1, got 0"),
    Row("vocoder-threads-above-the-cores", lambda w: w.prompt("--vocoder-threads", "100000"),
        BAD_USAGE, "--vocoder-threads 100000 is more than the"),
    Row("vocoder-threads-with-whole-utterances",
        lambda w: w.prompt("--out-audio", w.p("a.wav"), "--voice", "ethan", "--whole-utterance",
                           "--vocoder-threads", "1"), BAD_USAGE,
        "vocoding on a thread of its own (--vocoder-threads) needs streaming (stateful or "
        "windows), not whole utterances", engine="omni", opens=True, loads=True),  # a flag: not --validate-config's
    Row("batch-size-zero", lambda w: w.run("--batch-size", "0"), BAD_USAGE,
        "--batch-size must be at least 1"),
    Row("max-generate-length-negative", lambda w: w.prompt("--max-generate-length", "-1"),
        BAD_USAGE, "--max-generate-length must be at least 1, got -1"),
    Row("max-generate-length-is-the-files-default",
        lambda w: (w.req.write_text(json.dumps({"requests": [{"prompt": "a"}, {"prompt": "b",
                   "max_generate_length": 5}]})), w.run("--max-generate-length", "2"))[1],
        cli.EXIT_OK, "2 of 2 requests succeeded", opens=True, writes=("p.json",),
        then=lambda w: [len(e["stages"]["llm"]["output_tokens"]) for e in predictions(w)]
        == [2, 5] or pytest.fail(str(predictions(w)))),
    Row("no-chat-template-is-the-files-default", lambda w: w.run("--no-chat-template"),
        cli.EXIT_OK, "2 of 2 requests succeeded", opens=True, writes=("p.json",),
        then=lambda w: all(e["formatted_complete_request"] == e["messages"][0]["content"][0]
                           ["text"] for e in predictions(w)) or pytest.fail("templated")),
    Row("voice-without-out-audio", lambda w: w.prompt("--voice", "ethan"), BAD_USAGE,
        "--voice is for the speech of --out-audio; without --out-audio nothing speaks"),
    # --language is Qwen3-ASR's control too (its stage reads it without speaking): on a
    # graph whose stages do not read it, the request fails saying so
    Row("language-on-a-graph-without-its-stage", lambda w: w.prompt("--language", "english"),
        BAD_REQUEST, "language: no stage of this graph reads it (a Qwen3-ASR or Qwen3-TTS "
        "control; this graph runs llm)", opens=True),
    Row("instruct-with-input-file-without-speech", lambda w: w.run("--instruct", "Calm."),
        BAD_USAGE, "--instruct is for the speech of --output-audio-dir; without "
        "--output-audio-dir nothing speaks"),
    Row("voice-with-input-file-without-speech", lambda w: w.run("--voice", "ethan"), BAD_USAGE,
        "--voice is for the speech of --output-audio-dir"),
    Row("voice-is-the-files-default-speaker", voices_of_requests, BAD_REQUEST,
        "request 0: unknown voice 'nobody'", engine="omni", opens=True,
        writes=("p.json", "a", "a/audio_req1.wav", "a/rvq_req1.safetensors"),
        then=one_fails(0, "unknown voice 'nobody'")),
    Row("prompt-not-utf8", lambda w: w.prompt("--prompt", "caf\udce9"), BAD_USAGE,
        "--prompt is not UTF-8 text (the byte 0xe9 at character 3)"),
    Row("voice-not-utf8", lambda w: w.prompt("--out-audio", w.p("a.wav"), "--voice", "\udcff"),
        BAD_USAGE, "--voice is not UTF-8 text (the byte 0xff at character 0)", engine="omni"),
    Row("audio-flag-missing", lambda w: w.prompt("--audio", w.p("gone.wav")), BAD_USAGE,
        "--audio {}/gone.wav: No such file or directory", engine="omni"),
    Row("image-flag-is-a-directory", lambda w: w.prompt("--image", str(w.root)), BAD_USAGE,
        "is a directory, not a file", engine="omni"),
    # a media file a flag names is read before anything loads: one it would refuse is usage
    Row("audio-flag-not-audio", lambda w: w.prompt("--audio", bad_media(w, "junk.wav")),
        BAD_USAGE, "--audio {}/junk.wav: not audio libsndfile decodes (Error opening: Format "
        "not recognised.)", engine="omni"),
    Row("audio-flag-nan", lambda w: w.prompt("--audio", bad_media(w, "nan.wav")), BAD_USAGE,
        "--audio {}/nan.wav: 8000 of its 8000 samples are not finite numbers (NaN or infinity)",
        engine="omni"),
    Row("audio-flag-no-samples", lambda w: w.prompt("--audio", bad_media(w, "empty.wav")),
        BAD_USAGE, "--audio {}/empty.wav: holds no samples\n", engine="omni"),
    Row("ref-audio-flag-nan", lambda w: w.prompt("--out-audio", w.p("o.wav"), "--ref-audio",
        bad_media(w, "nan.wav")), BAD_USAGE, "--ref-audio {}/nan.wav: 8000 of its 8000 samples "
        "are not finite numbers", engine="tts"),
    Row("image-flag-not-an-image", lambda w: w.prompt("--image", bad_media(w, "junk.png")),
        BAD_USAGE, "--image {}/junk.png: not an image: cannot identify image file\n",
        engine="omni"),
    Row("image-flag-truncated", lambda w: w.prompt("--image", bad_media(w, "cut.png")),
        BAD_USAGE, "--image {}/cut.png: image file is truncated", engine="omni"),
    Row("image-flag-over-the-cap", lambda w: w.prompt("--image", bad_media(w, "big.png")),
        BAD_USAGE, "--image {}/big.png: 9800x9800 pixels, over the cap of 16777216 "
        "(--max-image-pixels raises it, up to 178956970)\n", engine="omni"),
    Row("image-flag-over-pillows-limit", lambda w: w.prompt("--image", bad_media(w, "bomb.png")),
        BAD_USAGE, "--image {}/bomb.png: 400000000 pixels, over the cap of 16777216 ",
        engine="omni"),
    Row("image-flag-over-a-lower-cap", lambda w: w.prompt("--image", bad_media(w, "small.png"),
        "--max-image-pixels", "4000"), BAD_USAGE, "--image {}/small.png: 64x64 pixels, over "
        "the cap of 4000 ", engine="omni"),
    Row("max-image-pixels-zero", lambda w: w.prompt("--max-image-pixels", "0"), BAD_USAGE,
        "--max-image-pixels must be in 1..178956970, got 0"),
    Row("video-flag-not-a-video", lambda w: w.prompt("--video", bad_media(w, "junk.mp4")),
        BAD_USAGE, "--video {}/junk.mp4: not a video FFmpeg decodes (", engine="omni"),
    Row("audio-with-input-file", lambda w: w.run("--audio", w.p("q.wav")), BAD_USAGE,
        "--audio, --image and --video go with --prompt"),
    Row("bad-sampling", lambda w: w.prompt("--sampling", '{"temprature": 1}'), BAD_USAGE,
        "--sampling: unknown sampling keys ['temprature']"),
    # -- the request file
    Row("input-file-missing", lambda w: [*w.run()[:3], w.p("nope.json")], BAD_USAGE,
        "nope.json: No such file or directory"),
    Row("input-file-is-a-directory", lambda w: [*w.run()[:3], str(w.root)], BAD_USAGE,
        "Is a directory"),
    Row("input-file-not-json", lambda w: (w.req.write_text("{oops"), w.run())[1], BAD_USAGE,
        "invalid JSON at line 1 column 2"),
    Row("input-file-not-utf8", lambda w: (w.req.write_bytes(b"\xff\xfe{"), w.run())[1],
        BAD_USAGE, "not UTF-8 text"),
    Row("sampling-nested-too-deeply",
        lambda w: w.prompt("--sampling", "[" * 60000 + "]" * 60000), BAD_USAGE,
        "--sampling: nested too deeply to read"),
    Row("input-file-nested-too-deeply",
        lambda w: (w.req.write_text('{"requests": [{"prompt": "a", "reference": ' + "[" * 100000
                                    + "]" * 100000 + "}]}"), w.run())[1],
        BAD_USAGE, "r.json: nested too deeply to read"),
    Row("requests-given-twice", lambda w: (w.req.write_text(
        '{"requests": [{"prompt": "a"}], "requests": [{"prompt": "b"}]}'), w.run())[1],
        BAD_USAGE, "r.json: top level: the key 'requests' is given more than once"),
    Row("a-message-key-given-twice", lambda w: (w.req.write_text(
        '{"requests": [{"prompt": "a"}, {"messages": [{"role": "user", "content": "x", '
        '"content": "y"}]}]}'), w.run())[1],
        BAD_USAGE, "r.json: requests[1].messages[0]: the key 'content' is given more than once"),
    Row("sampling-key-given-twice", lambda w: w.prompt("--sampling", '{"top_k": 1, "top_k": 5}'),
        BAD_USAGE, "--sampling: top level: the key 'top_k' is given more than once"),
    Row("requests-not-a-list", lambda w: (w.req.write_text('{"requests": 5}'), w.run())[1],
        BAD_USAGE, "needs a 'requests' list"),
    # -- output destinations, checked before any stage is opened
    Row("output-file-dir-missing", lambda w: [*w.run()[:5], w.p("no/p.json")], BAD_USAGE,
        "/no does not exist"),
    Row("output-file-is-a-directory", lambda w: [*w.run()[:5], str(w.root)], BAD_USAGE,
        "is a directory; give a file path"),
    Row("output-file-is-the-input-file", lambda w: [*w.run()[:5], str(w.req)], BAD_USAGE,
        "is the --input-file; writing it would destroy an input"),
    Row("output-file-is-the-graph", lambda w: [*w.run()[:5], str(w.eng / GRAPH)], BAD_USAGE,
        "is the graph (--config)"),
    Row("output-file-is-a-device", lambda w: [*w.run()[:5], "/dev/null"], BAD_USAGE,
        "is not a regular file"),
    Row("output-file-links-to-a-device",
        lambda w: ((w.root / "l.json").symlink_to("/dev/null"), [*w.run()[:5], w.p("l.json")])[1],
        BAD_USAGE, "is not a regular file"),
    Row("output-file-link-is-followed",
        lambda w: ((w.root / "t.json").write_text("old"), (w.root / "l.json").symlink_to("t.json"),
                   [*w.run()[:5], w.p("l.json"), *w.run()[6:]])[2],
        cli.EXIT_OK, "2 of 2 requests succeeded", opens=True, writes=("t.json", "l.json"),
        then=written_through_the_link),
    Row("out-audio-dir-missing", lambda w: w.prompt("--out-audio", w.p("no/a.wav")), BAD_USAGE,
        "/no does not exist", engine="omni"),
    Row("out-audio-is-the-audio-input",
        lambda w: w.prompt("--audio", w.p("q.wav"), "--out-audio", w.p("q.wav")), BAD_USAGE,
        "is the audio file", engine="omni"),
    Row("out-audio-is-the-output-file",
        lambda w: w.prompt("--out-audio", w.p("x"), "--output-file", w.p("x")), BAD_USAGE,
        "--output-file and --out-audio are the same file", engine="omni"),
    Row("output-audio-dir-is-a-file", lambda w: w.run("--output-audio-dir", str(w.req)),
        BAD_USAGE, "is not a directory", engine="omni"),
    Row("output-audio-dir-over-an-input", audio_dir_over_input, BAD_USAGE,
        "audio_req0.wav is the audio file", engine="omni"),
    Row("output-audio-dir-parent-missing", lambda w: w.run("--output-audio-dir", w.p("x/y/a")),
        BAD_USAGE, "/x/y does not exist", engine="omni"),
    Row("output-audio-dir-is-made", lambda w: w.run("--output-audio-dir", w.p("a")),
        cli.EXIT_OK, "2 of 2 requests succeeded", engine="omni", opens=True,
        writes=("p.json", "a", "a/audio_req0.wav", "a/rvq_req0.safetensors", "a/audio_req1.wav",
                "a/rvq_req1.safetensors")),
    Row("output-file-is-the-engine", lambda w: [*w.run()[:5], str(w.eng / "llm.onnx")],
        BAD_USAGE, "is a file of stage 'llm' (llm.onnx); writing it would destroy an input"),
    Row("output-file-is-the-tokenizer", lambda w: [*w.run()[:5], str(w.eng / "tokenizer.json")],
        BAD_USAGE, "is a file of stage 'llm' (tokenizer.json)"),
    Row("output-file-is-a-stage-config",
        lambda w: [*w.run()[:5], str(w.eng / "talker" / "config.json")], BAD_USAGE,
        "is a file of stage 'talker' (config.json)", engine="omni"),
    Row("output-file-is-an-encoder",
        lambda w: [*w.run()[:5], str(w.eng / "audio" / "audio_encoder.onnx")], BAD_USAGE,
        "is a file of stage 'thinker' (audio_encoder.onnx)", engine="omni"),
    Row("output-file-is-external-data",
        lambda w: (with_external_data(w), foreign(w), [*w.run()[:5], str(w.eng / "llm.onnx.data")])[2],
        BAD_USAGE, "is a file of stage 'llm' (llm.onnx.data)"),
    Row("output-file-in-the-engine-dir", lambda w: [*w.run()[:5], str(w.eng / "p.json")],
        BAD_USAGE, "lies inside " + "{eng}, an engine dir edge-build wrote"),
    Row("output-audio-dir-in-the-engine-dir",
        lambda w: w.run("--output-audio-dir", str(w.eng / "talker" / "out")), BAD_USAGE,
        "lies inside", engine="omni"),
    Row("output-audio-dir-is-the-engine-dir", lambda w: w.run("--output-audio-dir", str(w.eng)),
        BAD_USAGE, "--output-audio-dir {eng}: is an engine dir edge-build wrote", engine="omni"),
    Row("output-audio-dir-is-another-engine-dir", another_engine_dir, BAD_USAGE,
        "other: is an engine dir edge-build wrote", engine="omni"),
    Row("output-file-in-a-foreign-engine-dir",
        lambda w: (foreign(w), [*w.run()[:5], str(w.eng / "p.json"), *w.run()[6:]])[1],
        cli.EXIT_OK, "2 of 2 requests succeeded", opens=True, writes=("eng/p.json",)),
    Row("output-file-is-a-foreign-engine", lambda w: (foreign(w), [*w.run()[:5],
        str(w.eng / "config.json")])[1], BAD_USAGE, "is a file of stage 'llm' (config.json)"),
    Row("input-file-without-output-file", lambda w: w.run()[:4] + w.run()[6:], cli.EXIT_OK,
        "2 of 2 requests succeeded", opens=True, then=printed_predictions),
    # -- the engine dir: a stage that cannot be opened stops the run before any request runs
    Row("graph-missing", lambda w: ((w.eng / GRAPH).unlink(), w.run())[1], BAD_USAGE, GRAPH),
    Row("stage-config-missing", lambda w: ((w.eng / "config.json").unlink(), w.run())[1],
        BAD_USAGE, "config.json: missing", opens=True),
    Row("stage-config-not-json",
        lambda w: ((w.eng / "config.json").write_text("{"), w.run())[1], BAD_USAGE,
        "config.json: not valid JSON (line 1 column 2", opens=True),
    Row("stage-config-key-missing", lambda w: (w.drop("config.json", "vocab_size"), w.run())[1],
        BAD_USAGE, "config.json: missing 'vocab_size'", opens=True),
    Row("stage-config-nested-key-missing",
        lambda w: (w.drop("config.json", "builder_config.max_batch_size"), w.run())[1],
        BAD_USAGE, "missing 'builder_config.max_batch_size'", opens=True),
    Row("engine-file-missing", lambda w: ((w.eng / "llm.onnx").unlink(), w.run())[1],
        BAD_USAGE, "llm.onnx is missing", opens=True),
    Row("engine-file-garbage", lambda w: ((w.eng / "llm.onnx").write_text("x"), w.run())[1],
        BAD_USAGE, "llm.onnx is not a loadable ONNX model", opens=True),
    Row("engine-file-random-bytes", lambda w: (random_bytes(w.eng / "llm.onnx"), w.run())[1],
        BAD_USAGE, "llm.onnx is not a loadable ONNX model", opens=True),
    Row("engine-file-truncated", lambda w: (truncate(w.eng / "llm.onnx", 4000), w.run())[1],
        BAD_USAGE, "runs past the end at byte 4000 (truncated?)", opens=True),
    Row("external-data-short", lambda w: (with_external_data(w, 1000), w.run())[1], BAD_USAGE,
        "llm.onnx.data, which holds 1000 (truncated?)", opens=True),
    Row("external-data-missing",
        lambda w: (with_external_data(w), (w.eng / "llm.onnx.data").unlink(), w.run())[2],
        BAD_USAGE, "its external data", opens=True),
    Row("table-data-truncated",
        lambda w: (truncate_data(w.eng / "embedding.safetensors"), w.run())[1], BAD_USAGE,
        "embedding.safetensors: not a readable safetensors file (tensor", opens=True),
    Row("cuda-build-without-cuda",
        lambda w: (w.edit("config.json", lambda c: c.update(device="cuda")), w.run())[1],
        BAD_USAGE, "this onnxruntime has no CUDAExecutionProvider", opens=True),
    Row("tokenizer-missing", lambda w: ((w.eng / "tokenizer.json").unlink(), w.run())[1],
        BAD_USAGE, "tokenizer.json: missing", opens=True),
    Row("tokenizer-garbage", lambda w: ((w.eng / "tokenizer.json").write_text("{}"), w.run())[1],
        BAD_USAGE, "tokenizer.json: not a tokenizer file", opens=True),
    Row("chat-template-syntax-error",
        lambda w: ((w.eng / "chat_template.jinja").write_text("{% for %}"), w.run())[1],
        BAD_USAGE, "chat_template.jinja: line 1", opens=True),
    Row("embedding-missing", lambda w: ((w.eng / "embedding.safetensors").unlink(), w.run())[1],
        BAD_USAGE, "embedding.safetensors: missing", opens=True),
    Row("embedding-truncated", lambda w: (truncate(w.eng / "embedding.safetensors"), w.run())[1],
        BAD_USAGE, "embedding.safetensors: not a readable safetensors file", opens=True),
    Row("talker-speakers-missing",
        lambda w: (w.drop("talker/config.json", "speakers"), w.prompt("--out-audio", w.p("a.wav")))[1],
        BAD_USAGE, "talker/config.json: missing 'speakers'", engine="omni", opens=True),
    Row("talker-table-missing-a-tensor",
        lambda w: (no_tts_special(w), w.prompt("--out-audio", w.p("a.wav")))[1], BAD_USAGE,
        "projections.safetensors: has no tensor tts_special", engine="omni", opens=True),
    Row("code-predictor-missing",
        lambda w: (shutil.rmtree(w.eng / "code_predictor"), w.prompt("--out-audio", w.p("a.wav")))[1],
        BAD_USAGE, "code_predictor: the stage folder does not exist", engine="omni", opens=True),
    Row("audio-encoder-key-missing",
        lambda w: (w.drop("audio/config.json", "num_mel_bins"), w.run())[1], BAD_USAGE,
        "audio/config.json: missing 'num_mel_bins'", engine="omni", opens=True),
    Row("code2wav-window-too-long",
        lambda w: (w.stage("code2wav", lambda s: s.setdefault("config", {}).update(window_frames=10**6)),
                   w.prompt("--out-audio", w.p("a.wav")))[1],
        BAD_USAGE, "exceed the engine's max_frames", engine="omni", opens=True),
    # -- keys that act differently, or not at all, on a graph
    Row("tts-repetition-penalty-is-the-talkers", lambda w: tts_file(w, repetition_penalty=1.0),
        cli.EXIT_OK, "1 of 1 requests succeeded", engine="tts", opens=True,
        writes=("p.json", "a", "a/audio_req0.wav", "a/rvq_req0.safetensors"),
        then=penalty_is(1.0)),
    Row("tts-talker-repetition-penalty-wins",
        lambda w: tts_file(w, repetition_penalty=1.0, talker_repetition_penalty=1.2),
        cli.EXIT_OK, "1 of 1 requests succeeded", engine="tts", opens=True,
        writes=("p.json", "a", "a/audio_req0.wav", "a/rvq_req0.safetensors"),
        then=penalty_is(1.2)),
    Row("tts-text-model-keys-say-so", lambda w: tts_file(w, temperature=0.5, top_k=3),
        cli.EXIT_OK, "warning: max_generate_length, temperature, top_k change nothing here: this "
        "graph has no text "
        "model", engine="tts", opens=True,
        writes=("p.json", "a", "a/audio_req0.wav", "a/rvq_req0.safetensors")),
    Row("talker-keys-without-speech-say-so", lambda w: mixed_file(w, {"prompt": "a"},
        talker_temperature=0.5, voice="ethan"), cli.EXIT_OK,
        "warning: talker_max_new_tokens, talker_temperature, talker_top_k, voice change nothing "
        "here: this run does not speak",
        engine="omni", opens=True, writes=("p.json",)),
    Row("omni-talker-do-sample-false-is-greedy",
        lambda w: omni_talker_params(w, talker_do_sample=False, talker_temperature=0.9),
        cli.EXIT_OK, "1 of 1 requests succeeded", engine="omni", opens=True, writes=OMNI_SPOKE,
        then=greedy_talker),
    Row("omni-subtalker-dosample-false-is-greedy",
        lambda w: omni_talker_params(w, subtalker_dosample=False, talker_top_k=1),
        cli.EXIT_OK, "1 of 1 requests succeeded", engine="omni", opens=True, writes=OMNI_SPOKE,
        then=greedy_talker),
    Row("omni-prompt-says-what-it-wrote", lambda w: w.prompt("--out-audio", w.p("a.wav")),
        cli.EXIT_OK, "edge-infer: wrote {}/a.wav (", engine="omni", opens=True,
        writes=("a.wav",)),
    Row("omni-talker-text-mode-says-so",
        lambda w: omni_talker_params(w, talker_non_streaming_mode=1), cli.EXIT_OK,
        "warning: talker_non_streaming_mode changes nothing here: no stage of this graph reads "
        "it", engine="omni", opens=True, writes=OMNI_SPOKE),
    Row("flags-that-change-nothing-say-so",
        lambda w: w.run("--no-cuda-graphs", "--batching", "cohort", "--stage-patience", "3",
                        "--batch-size", "8", "--whole-utterance", "--vocoder-threads", "1"),
        cli.EXIT_OK, "warning: talker_max_new_tokens, talker_top_k, --whole-utterance, "
        "--vocoder-threads change nothing here: "
        "this run does not speak\n"
        "edge-infer: warning: --stage-patience changes nothing here: cohorts run each stage in "
        "turn (it is for --batching inflight)\nedge-infer: warning: --no-cuda-graphs changes "
        "nothing here: no engine of this run is on a GPU", opens=True, writes=("p.json",)),
    Row("batch-size-above-the-build-says-so", lambda w: w.run("--batch-size", "8"), cli.EXIT_OK,
        "warning: --batch-size 8 is above this build's: each stage runs at most 3 requests at "
        "once", opens=True, writes=("p.json",)),
    Row("unknown-speech-stage-key", lambda w: mixed(w, {"prompt": "a", "sampling":
        {"subtalker_top_kk": 3}}), BAD_REQUEST, "unknown speech-stage key ['subtalker_top_kk']; "
        "did you mean 'subtalker_top_kk' -> 'subtalker_top_k'?", opens=True, writes=("p.json",),
        then=one_fails(1, "unknown speech-stage key")),
    Row("talker-language-is-a-tts-control", lambda w: mixed_file(w, {"prompt": "a"},
        talker_language="english"), BAD_REQUEST, "talker_language: no stage of this graph "
        "reads it", opens=True, writes=("p.json",)),
    Row("emit-kind-relabelled", relabel_text_emit, BAD_USAGE,
        "invalid graph: $.stages[0].emits[0].kind: 'text' of runner 'llm.backbone' is text, "
        "not audio"),
    Row("emit-unknown", lambda w: (w.stage("llm", lambda s: s["emits"].append({"id": "x"})),
        w.run())[1], BAD_USAGE, "$.stages[0].emits[1].id: runner 'llm.backbone' makes no "
        "output 'x'"),
    # -- bad text: a lone surrogate (JSON's "\udc80") fails its request alone
    Row("lone-surrogate-in-content", lambda w: mixed(w, {"messages": [{"role": "user",
        "content": [{"type": "text", "text": "x\udc80y"}]}]}), BAD_REQUEST,
        "messages[0].content[0].text: not valid Unicode text (a lone surrogate \\udc80 at "
        "character 1", opens=True, writes=("p.json",),
        then=lambda w: (one_fails(1, "not valid Unicode text")(w), escaped_echo(w))),
    Row("lone-surrogate-in-prompt", lambda w: mixed(w, {"prompt": "\ud800"}), BAD_REQUEST,
        "prompt: not valid Unicode text", opens=True, writes=("p.json",),
        then=one_fails(1, "prompt: not valid")),
    Row("lone-surrogate-in-a-key", lambda w: mixed(w, {"prompt": "a", "_\udc80": 1}),
        BAD_REQUEST, "a key: not valid Unicode text", opens=True, writes=("p.json",),
        then=one_fails(1, "a key: not valid")),
    Row("lone-surrogate-in-reference",
        lambda w: mixed(w, {"prompt": "a", "reference": {"answer": "caf\udce9"}}), cli.EXIT_OK,
        "3 of 3 requests succeeded", opens=True, writes=("p.json",),
        then=lambda w: (reference_kept(w), escaped_reference(w))),
    Row("lone-surrogate-at-the-top-level",
        lambda w: mixed_file(w, {"prompt": "a"}, stop=["\udc80"]), BAD_USAGE,
        "top level: stop[0]: not valid Unicode text"),
    # -- a bad request fails alone: the others are answered, and predictions are written
    Row("audio-part-on-a-text-engine",
        lambda w: mixed(w, {"messages": [{"role": "user", "content": [
            {"type": "audio", "audio": w.p("q.wav")}, {"type": "text", "text": "what"}]}]}),
        BAD_REQUEST, "request 1: this model reads text only", opens=True, writes=("p.json",),
        then=one_fails(1, "this model reads text only; the request has audio parts")),
    Row("image-part-on-a-text-engine",
        lambda w: mixed(w, {"messages": [{"role": "user", "content": [
            {"type": "image", "image": w.p("q.png")}, {"type": "text", "text": "what"}]}]}),
        BAD_REQUEST, "request 1: this model reads text only", opens=True, writes=("p.json",),
        then=one_fails(1, "this model reads text only; the request has image parts")),
    Row("chat-template-raises", raising_template, BAD_REQUEST,
        "chat template: system messages are not supported", opens=True, writes=("p.json",),
        then=one_fails(1, "chat template: system messages are not supported")),
    Row("prompt-longer-than-the-build",
        lambda w: mixed(w, {"prompt": "word " * 200}), BAD_REQUEST, "--max-input-len",
        opens=True, writes=("p.json",), then=one_fails(1, "the engine was built for at most")),
    Row("audio-file-missing",
        lambda w: mixed(w, {"messages": [{"role": "user", "content": [
            {"type": "audio", "audio": w.p("gone.wav")}]}]}),
        BAD_REQUEST, "gone.wav", engine="omni", opens=True, writes=("p.json",),
        then=one_fails(1, "gone.wav")),
    Row("audio-file-not-audio",
        lambda w: (w.req.with_name("junk.wav").write_text("junk"), mixed(w, {"messages": [
            {"role": "user", "content": [{"type": "audio", "audio": w.p("junk.wav")}]}]}))[1],
        BAD_REQUEST, "junk.wav", engine="omni", opens=True, writes=("p.json",),
        then=one_fails(1, "audio ")),
    # a request file's media file the run refuses fails its request alone, naming the file
    Row("audio-file-nan", lambda w: with_media(w, "audio", "nan.wav"), BAD_REQUEST,
        "request 1: audio {}/nan.wav: 8000 of its 8000 samples are not finite numbers",
        engine="omni", opens=True, writes=("p.json",), then=one_fails(1, "nan.wav: 8000 of")),
    Row("image-file-over-the-cap", lambda w: with_media(w, "image", "big.png"), BAD_REQUEST,
        "request 1: image {}/big.png: 9800x9800 pixels, over the cap of 16777216 ",
        engine="omni", opens=True, writes=("p.json",), then=one_fails(1, "over the cap")),
    Row("image-file-over-a-lower-cap",
        lambda w: [*with_media(w, "image", "small.png"), "--max-image-pixels", "4000"],
        BAD_REQUEST, "request 1: image {}/small.png: 64x64 pixels, over the cap of 4000 ",
        engine="omni", opens=True, writes=("p.json",), then=one_fails(1, "over the cap")),
    Row("image-file-not-an-image", lambda w: with_media(w, "image", "junk.png"), BAD_REQUEST,
        "request 1: image {}/junk.png: not an image: cannot identify image file\n",
        engine="omni", opens=True, writes=("p.json",), then=one_fails(1, "junk.png: not an")),
    Row("engine-error-on-a-cohort", inject_engine_fault, BAD_REQUEST,
        "llm: RuntimeError: [ONNXRuntimeError]", opens=True, writes=("p.json",),
        then=one_fails(0, "llm: RuntimeError: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION")),
    Row("unknown-voice", lambda w: w.prompt("--out-audio", w.p("a.wav"), "--voice", "nobody"),
        BAD_REQUEST, "unknown voice 'nobody'; this model's voices are", engine="omni",
        opens=True),
    Row("disk-full-writing-predictions",
        lambda w: (w.monkeypatch.setattr("edgeomni.runtime.predictions.write_json_atomic", disk_full),
                   w.run())[1], cli.EXIT_INTERNAL,
        "cannot write the outputs: No space left on device", opens=True),
    Row("disk-full-writing-audio",
        lambda w: (w.monkeypatch.setattr("edgeomni.runtime.outputs.write_wav", disk_full),
                   w.prompt("--out-audio", w.p("a.wav")))[1], cli.EXIT_INTERNAL,
        "cannot write the outputs: No space left on device", engine="omni", opens=True),
    Row("internal-error",
        lambda w: (w.monkeypatch.setattr(cli, "_report", a_bug), w.run())[1], cli.EXIT_INTERNAL,
        "edge-infer: error: internal error: TypeError: a bug (--verbose shows where)", opens=True,
        writes=("p.json",)),
    # -- interrupts: what finished is written, the rest fail as interrupted; nothing else
    Row("sigint-mid-run", signal_in_cohort(signal.SIGINT), 130,
        "interrupted; 1 of 3 requests had finished; wrote", opens=True, writes=("p.json",),
        then=interrupted_after_first),
    Row("sigterm-mid-run", signal_in_cohort(signal.SIGTERM), 143,
        "interrupted; 1 of 3 requests had finished", opens=True, writes=("p.json",),
        then=interrupted_after_first),
    Row("sigint-before-any-request-finished",
        lambda w: ((w.root / "p.json").write_text("earlier"), signal_in_cohort(signal.SIGINT, 1)(w))[1],
        130, "interrupted; 0 of 3 requests had finished\n", opens=True),
    Row("sigint-while-loading", signal_while_loading, 130, "edge-infer: interrupted"),
    Row("sigint-mid-run-inflight", signal_in_cohort(signal.SIGINT, batching="inflight"), 130,
        "interrupted; 1 of 3 requests had finished; wrote", opens=True, writes=("p.json",),
        then=interrupted_after_first),
    Row("sigterm-before-any-finished-inflight",
        lambda w: ((w.root / "p.json").write_text("earlier"),
                   signal_in_cohort(signal.SIGTERM, 1, "inflight")(w))[1],
        143, "interrupted; 0 of 3 requests had finished\n", opens=True),
]  # fmt: skip


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder or anything else."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = path.read_bytes() if path.is_file() and not path.is_fifo() else None
    return out


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_fault(row: Row, request, tmp_path: Path, monkeypatch, capsys) -> None:
    engine = request.getfixturevalue(f"{row.engine}_engine")
    world = World(tmp_path / "w", engine, monkeypatch)
    argv = row.setup(world)
    before = snapshot(world.root)
    opened: list[object] = []
    real_open = Pipeline.open
    monkeypatch.setattr(
        Pipeline, "open", lambda self, ids: (opened.append(ids), real_open(self, ids))[1]
    )
    capsys.readouterr()  # what building the fixtures printed
    code = cli.main(argv)
    world.out, err = capsys.readouterr()
    assert code == row.code, err
    message = row.message.replace("{eng}", str(world.eng)).replace("{}", str(world.root))
    assert message in err, err
    assert "Traceback" not in err
    if code == BAD_USAGE:
        assert err.count("edge-infer: error:") == 1 and err.strip().count("\n") == 0, err
    assert bool(opened) == row.opens, f"stages opened: {opened}"
    after = snapshot(world.root)
    for rel in row.writes:
        assert rel in after, f"{rel} was not written"
        after.pop(rel)
        before.pop(rel, None)
    assert after == before, "changed on disk: " + ", ".join(
        sorted(k for k in set(before) | set(after) if before.get(k, 0) != after.get(k, 0))
    )
    if row.then is not None:
        row.then(world)


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.code == BAD_USAGE and r.opens and not r.loads], ids=lambda r: r.id
)
def test_validate_config_finds_it(row: Row, request, tmp_path: Path, monkeypatch, capsys) -> None:
    """--validate-config finds every broken-engine-dir fault without loading an engine."""
    from edgeomni.runtime import engine as engine_mod

    engine = request.getfixturevalue(f"{row.engine}_engine")
    world = World(tmp_path / "w", engine, monkeypatch)
    row.setup(world)
    monkeypatch.setattr(engine_mod, "OrtEngine", None)  # loading any engine would fail loudly
    capsys.readouterr()
    code = cli.main(["--config", str(world.eng), "--validate-config"])
    err = capsys.readouterr().err
    assert code == BAD_USAGE, err
    assert row.message in err and "invalid engine dir" in err, err


def test_validate_config_loads_no_engine(qwen3_engine: Path, omni_engine: Path, monkeypatch,
                                         capsys) -> None:  # fmt: skip
    from edgeomni.runtime import engine as engine_mod

    monkeypatch.setattr(engine_mod, "OrtEngine", None)
    for eng in (qwen3_engine, omni_engine):
        assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_OK
    assert "valid (3 stages" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_stop_a_real_process(qwen3_engine: Path, tmp_path: Path, signum: int, code: int):
    """A real edge-infer process, blocked reading its request file (a FIFO nobody writes):
    the signal gives one line and the shell's status, no traceback."""
    os.mkfifo(tmp_path / "fifo.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeomni.runtime.cli", "--config", str(qwen3_engine),
         "--input-file", str(tmp_path / "fifo.json"), "--output-file", str(tmp_path / "p.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _reading(proc.pid, tmp_path / "fifo.json"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip() == "edge-infer: interrupted" and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.json"]


def _reading(pid: int, path: Path) -> bool:
    """Whether process ``pid`` is blocked opening a FIFO (Linux: its wchan) or has it open."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        fds = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return False
    return wchan == "wait_for_partner" or str(path) in fds
