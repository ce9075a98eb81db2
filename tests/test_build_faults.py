"""edge-build under bad input and faults: it never deletes what it did not write, leaves no
litter, checks the cheap things before any export, and answers with one line, not a traceback.

The table runs the CLI in-process; each row sets up files under tmp_path, runs edge-build, and
checks its exit status, a fragment of its message, and that everything under tmp_path but the
paths the row names is byte for byte as it was. The interrupt tests run real builds of the tiny
Qwen3 in a subprocess and signal them while they export.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import build_fault_cases as c
import pytest
from build_checks import manifest_matches, snapshot

from edgeomni.builder import cli, manifest
from edgeomni.builder.build import GRAPH_FILE
from edgeomni.export import tiny, tiny_tts

MANIFEST = manifest.MANIFEST
SIZES = ("--max-batch-size", "2", "--max-input-len", "32", "--max-kv-cache-capacity", "64")


@dataclass
class Env:
    """A row's tmp_path and the session's tiny checkpoints and engines (copied, never changed)."""

    tmp: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    logs: pytest.LogCaptureFixture

    def ckpt(self, fixture: str = "qwen3_ckpt", drop: tuple[str, ...] = ()) -> Path:
        dst = self.tmp / "ckpt"
        shutil.copytree(self.request.getfixturevalue(fixture), dst)
        for name in drop:
            (dst / name).unlink()
        return dst

    def engine(self, name: str = "eng") -> Path:
        dst = self.tmp / name
        shutil.copytree(self.request.getfixturevalue("qwen3_engine"), dst)
        return dst

    def argv(self, eng: Path, *extra: str, ckpt: Path | None = None) -> list[str]:
        ckpt = ckpt or self.request.getfixturevalue("qwen3_ckpt")
        return ["--model-dir", str(ckpt), "--engine-dir", str(eng), *SIZES, *extra]

    def graph_only(self, eng: Path) -> list[str]:
        ckpt = self.request.getfixturevalue("qwen3_ckpt")
        return ["--graph-only", "--model-dir", str(ckpt), "--engine-dir", str(eng)]


@dataclass(frozen=True)
class Fault:
    setup: Callable[[Env], list[str]]  # makes files under env.tmp; returns edge-build's argv
    code: int
    message: str
    changes: tuple[str, ...] = ()  # paths under tmp_path that may change (all else must not)
    exports: bool = False  # whether the export may run; else calling it fails the test
    after: Callable[[Env], None] | None = None  # checks of what did change
    command: Callable[[list[str]], int] = cli.main  # edge-build, or another writer of files




# ---- setups: each builds a situation under env.tmp and returns the command line


def issue_repro(env: Env) -> list[str]:
    """Issue 14: mkdir -p d/src; echo '{}' > d/multistage_config.json; echo x > d/src/a.tex"""
    d = env.tmp / "d"
    (d / "src").mkdir(parents=True)
    (d / GRAPH_FILE).write_text("{}\n")
    (d / "src" / "a.tex").write_text("x\n")
    return env.argv(d)


def user_files_in_build(env: Env) -> list[str]:
    eng = env.engine()
    (eng / "predictions.json").write_text('[{"request_idx": 0}]\n')
    (eng / "results" / "run1").mkdir(parents=True)
    (eng / "results" / "run1" / "audio_req0.wav").write_bytes(b"RIFF....WAVE")
    return env.argv(eng)


def changed_file(env: Env) -> list[str]:
    eng = env.engine()
    with (eng / "chat_template.jinja").open("a") as f:
        f.write("{# my edit #}")
    return env.argv(eng)


def old_build(env: Env) -> list[str]:
    eng = env.engine()
    (eng / MANIFEST).unlink()
    return env.argv(eng)


def old_build_without_graph(env: Env) -> list[str]:
    """Told by its config.json's format alone."""
    eng = env.engine()
    (eng / MANIFEST).unlink()
    (eng / GRAPH_FILE).unlink()
    return env.argv(eng)


def symlink_in_build(env: Env) -> list[str]:
    eng = env.engine()
    (eng / "latest").symlink_to(env.tmp)
    return env.argv(eng)


def many_user_files(env: Env) -> list[str]:
    eng = env.engine()
    for i in range(12):
        (eng / f"note{i:02}.txt").write_text(str(i))
    return env.argv(eng)


def unreadable_manifest(env: Env) -> list[str]:
    eng = env.engine()
    (eng / MANIFEST).write_text("{oops")
    return env.argv(eng)


def manifest_leading_out(env: Env) -> list[str]:
    eng = env.engine()
    files = manifest.read(eng) or {}
    manifest.write(eng, {**files, "../ckpt/model.safetensors": {"size": 1}})
    return env.argv(eng)


def engine_dir_is_a_file(env: Env) -> list[str]:
    (env.tmp / "eng").write_text("not a directory")
    return env.argv(env.tmp / "eng")


def parent_is_a_file(env: Env) -> list[str]:
    (env.tmp / "f").write_text("not a directory")
    return env.argv(env.tmp / "f" / "eng")


def workspace_path_taken(env: Env) -> list[str]:
    (env.tmp / f".eng.edge-build-{os.getpid()}").write_text("in the way")
    return env.argv(env.tmp / "eng")


def own_build(env: Env) -> list[str]:
    eng = env.engine()  # built with --max-batch-size 3
    (eng / "chat_template.jinja").unlink()  # a file of the manifest that is gone is fine
    return env.argv(eng)


def rebuilt(env: Env) -> None:
    eng = env.tmp / "eng"
    manifest_matches(eng)
    assert json.loads((eng / "config.json").read_text())["builder_config"]["max_batch_size"] == 2
    assert (eng / "chat_template.jinja").is_file()


HAND_GRAPH = '{"version": 1, "note": "written by hand"}\n'


def hand_written_graph(env: Env) -> list[str]:
    eng = env.engine()
    (eng / GRAPH_FILE).write_text(HAND_GRAPH)
    (eng / f"{GRAPH_FILE}.orig").write_text("an older one, kept\n")
    return env.graph_only(eng)


def graph_kept_aside(env: Env) -> None:
    eng = env.tmp / "eng"
    assert (eng / f"{GRAPH_FILE}.orig.1").read_text() == HAND_GRAPH
    built = env.request.getfixturevalue("qwen3_engine") / GRAPH_FILE
    assert (eng / GRAPH_FILE).read_bytes() == built.read_bytes()
    assert manifest.is_own(eng, GRAPH_FILE)
    kept = f"{GRAPH_FILE} was not written by edge-build: kept it as {GRAPH_FILE}.orig.1"
    assert kept in env.logs.text


def own_graph(env: Env) -> list[str]:
    return env.graph_only(env.engine())


def no_orig(env: Env) -> None:
    assert not list((env.tmp / "eng").glob("*.orig*"))
    manifest_matches(env.tmp / "eng")


def no_graph_possible(env: Env) -> list[str]:
    eng = env.engine()
    (eng / GRAPH_FILE).write_text(HAND_GRAPH)
    (eng / "config_world2.json").write_text("{}")
    return env.graph_only(eng)


def foreign_engines_given_a_graph(env: Env) -> list[str]:
    """Engines from another tool get a graph from --graph-only; a full build must then refuse
    to replace them, since the manifest lists only the graph."""
    eng = env.engine()
    (eng / MANIFEST).unlink()
    (eng / GRAPH_FILE).unlink()
    assert cli.main(env.graph_only(eng)) == cli.EXIT_OK
    assert set(manifest.read(eng) or {}) == {GRAPH_FILE}
    return env.argv(eng)


def no_tokenizer(env: Env) -> list[str]:
    return env.argv(env.tmp / "eng", ckpt=env.ckpt(drop=("tokenizer.json",)))


def prompt_longer_than_cache(env: Env) -> list[str]:
    return [*env.argv(env.tmp / "eng"), "--max-input-len", "64", "--max-kv-cache-capacity", "32"]


def omni_without_speakers(env: Env) -> list[str]:
    ckpt = env.ckpt("omni_ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["talker_config"]["speaker_id"] = {}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return env.argv(env.tmp / "eng", "--components", "llm,talker", ckpt=ckpt)


def omni_without_processor(env: Env) -> list[str]:
    ckpt = env.ckpt("omni_ckpt", drop=("processor_config.json",))
    return env.argv(env.tmp / "eng", "--components", "llm,visual", ckpt=ckpt)


def disk_full(env: Env) -> list[str]:
    from edgeomni.export.families.qwen3.build import HOOKS as qwen3

    def full(*args: object, **kwargs: object) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    env.monkeypatch.setattr(qwen3, "export_component", full)
    return env.argv(env.engine())


def bug_in_export(env: Env) -> list[str]:
    from edgeomni.export.families.qwen3.build import HOOKS as qwen3

    def broken(*args: object, **kwargs: object) -> Path:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    env.monkeypatch.setattr(qwen3, "export_component", broken)
    return env.argv(env.engine())


def zero_batch(env: Env) -> list[str]:
    return [*env.argv(env.tmp / "eng"), "--max-batch-size", "0"]


def unknown_component(env: Env) -> list[str]:
    return env.argv(env.tmp / "eng", "--components", "talker")


def no_checkpoint(env: Env) -> list[str]:
    return env.argv(env.tmp / "eng", ckpt=env.tmp / "nothing-here")


@pytest.fixture(scope="session")
def tts_base_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny_tts import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("tts-base") / "ckpt", "base", "tiny")


BAD, OK = cli.EXIT_BAD_INPUT, cli.EXIT_OK
REFUSED = "move them out or choose another --engine-dir"
GRAPH_ONLY_WRITES = ("eng/" + GRAPH_FILE, f"eng/{GRAPH_FILE}.orig.1", "eng/" + MANIFEST)
CODEC = "speech_tokenizer/config.json"
# issue 30: what edge-infer would refuse (item 4), Qwen3-TTS configs upstream takes (item 5:
# built, or refused by key before any export), the tiny writers and positions (item 9)
ISSUE_30 = [
    pytest.param(Fault(c.export_error_with_cause, cli.EXIT_FAILED, "internal error: RuntimeError: "
                       "Failed to export. (TypeError: 'NoneType' object is not callable)",
                       exports=True), id="internal-error-with-cause"),
    *(pytest.param(Fault(setup, BAD, message), id=name) for name, setup, message in (
        ("config-nested-too-deeply", c.text_file("config.json", "[" * 10**5 + "]" * 10**5),
         "config.json: nested too deeply to read"),
        ("config-not-utf8", c.text_file("config.json", b"{\xff}"), "config.json: cannot be read"),
        ("tokenizer-not-json", c.text_file("tokenizer.json", "{oops"),
         "tokenizer.json: not a tokenizer file"),
        ("tokenizer-not-a-tokenizer", c.text_file("tokenizer.json", '{"version": "1.0"}'),
         "tokenizer.json: not a tokenizer file"),
        ("tokenizer-config-not-json", c.text_file("tokenizer_config.json", "{"),
         "tokenizer_config.json: not valid JSON (Expecting property name"),
        ("tokenizer-config-a-list", c.text_file("tokenizer_config.json", "[]"),
         "tokenizer_config.json: expected a JSON object"),
        ("template-syntax", c.text_file("chat_template.jinja", "{% for m in messages %}\n"
         "{{ m.content }\n{% endfor %}"), "chat_template.jinja: the chat template does not "
         "parse: line 2: unexpected '}'"),
        ("template-unknown-filter", c.text_file("chat_template.jinja", "{{ messages | nope }}"),
         "chat_template.jinja: the chat template does not parse: line 1: No filter named 'nope'"),
        ("template-not-utf8", c.text_file("chat_template.jinja", b"{{ '\xff' }}"),
         "chat_template.jinja: cannot be read"),
        ("template-in-config-syntax", c.template_in_config("{{ x }}\n{% if %}"),
         "tokenizer_config.json: chat_template: the chat template does not parse: line 2"),
        ("template-in-config-not-text", c.template_in_config(5),
         "tokenizer_config.json: chat_template: not a string but int"),
        ("chat-template-json-broken", c.text_file("chat_template.json", "{",
         drop=("chat_template.jinja",)), "chat_template.json: not valid JSON"),
        ("tts-vocab-not-json", c.tts_vocab_not_json, "vocab.json: not valid JSON"),
        ("tts-merges-out-of-vocabulary", c.tts_merges_out_of_vocabulary,
         "vocab.json + merges.txt do not make a tokenizer (Exception: Error while initializing "
         "BPE: Token `zz` out of vocabulary)"),
    )),
    *(pytest.param(Fault(c.tts_config(file, key, value), BAD, message), id=f"tts-{key}")
      for file, key, value, message in (
        (CODEC, "decoder_config.sliding_window", None,
         "decoder_config.sliding_window None: upstream's decoder needs a window"),
        (CODEC, "decoder_config.codebook_dim", c.REMOVE, "decoder_config.codebook_dim is missing"),
        (CODEC, "decoder_config.num_quantizers", 8, "decoder_config.num_quantizers 8 is not "
         "config.json's talker_config.num_code_groups 16"),
        (CODEC, "encoder_valid_num_quantizers", 8,
         "encoder_valid_num_quantizers 8 is not config.json's talker_config.num_code_groups 16"),
        (CODEC, "encoder_config.pad_mode", "reflect",
         "encoder_config.pad_mode 'reflect': only 'constant' padding is exported"),
        (CODEC, "encoder_config", c.REMOVE, "speech_tokenizer/config.json: no encoder_config"),
        (CODEC, "decode_upsample_rate", 960,
         "decode_upsample_rate 960 is not the decoder's 1920 samples per frame"),
        ("config.json", "speaker_encoder_config.enc_channels", [16, 16, 16, 16, 32],
         "enc_channels [16, 16, 16, 16, 32]: the last must be the sum"),
        ("config.json", "speaker_encoder_config.enc_dilations", [1, 2, 1],
         "enc_channels, enc_kernel_sizes, enc_dilations must be lists of one length"),
        ("config.json", "talker_config.rms_norm_eps", "x",
         "config.json: talker_config.rms_norm_eps must be a number > 0, got 'x'"),
        ("config.json", "talker_config.use_sliding_window", True,
         "talker_config.use_sliding_window true: sliding-window layers are not supported"),
    )),
    pytest.param(Fault(c.tts_accepted_variants, OK, "wrote", exports=True,
                       changes=("eng", "ckpt", "ref.wav", "clone.wav"),
                       after=c.clones_as_transformers_mimi),
                 id="tts-base-no-vq-projection-and-other-accepted-configs", marks=pytest.mark.slow),
    *(pytest.param(Fault(setup, code, message, changes, command=tool, after=after), id=name)
      for name, tool, setup, code, message, changes, after in (
        ("tiny-into-a-full-dir", tiny.main, c.tiny_into("tiny"), BAD,
         "d is not empty (notes.txt); choose a new or empty directory, or pass --force", (), None),
        ("tiny-tts-into-a-full-dir", tiny_tts.main, c.tiny_into("tiny_tts", "--kind", "base"), BAD,
         "d is not empty (notes.txt); choose", (), None),
        ("tiny-force", tiny.main, c.tiny_into("tiny", "--force"), OK, "", ("d",), c.kept_mine),
        ("tiny-again", tiny.main, c.tiny_again(False), OK, "", ("d",), c.replaced_whole),
        ("tiny-again-after-an-edit", tiny.main, c.tiny_again(True), BAD, "d is not empty", (), None),
        ("tiny-out-is-a-file", tiny.main, c.tiny_out_is_a_file, BAD,
         "TMP/f exists and is not a directory", (), None),
        ("tiny-bad-family", tiny.main, c.tiny_args("qwen9", "TMP/d"), BAD,
         "argument MODEL_TYPE: invalid choice: 'qwen9'", (), None),
        ("tiny-tts-bad-seed", tiny_tts.main, c.tiny_args("TMP/d", "--seed", "x"), BAD,
         "argument --seed: invalid int value: 'x'", (), None),
    )),
    pytest.param(Fault(c.past_positions, BAD, "exists and is not a directory",
                       after=c.warned_of_positions), id="kv-capacity-past-the-position-limit"),
]  # fmt: skip
# issue 50: int4_awq's calibration requests that cannot run through a Base Qwen3-TTS graph, and
# config values of the wrong kind, refused before any export
ISSUE_50 = [
    pytest.param(Fault(c.tts_base_awq(None), BAD, "each request needs ref_audio (ref_audio: a "
                       "clip (any WAV) whose voice the Base checkpoint's talker clones; ref_text, "
                       "its transcript, is optional), which the shipped calibration text cannot "
                       "give: pass --calibration FILE"), id="awq-tts-base-without-calibration"),
    pytest.param(Fault(c.tts_base_awq({"requests": [{"prompt": "Hello there."}]}), BAD,
                       "calib.json: request 0 sets no ref_audio"),
                 id="awq-tts-base-calibration-without-ref-audio"),
    pytest.param(Fault(c.qwen3_config("num_hidden_layers", -1), BAD,
                       "config.json: num_hidden_layers must be an integer >= 1, got -1"),
                 id="config-negative-layers"),
]  # fmt: skip
FAULTS = [
    pytest.param(Fault(issue_repro, BAD, "looks like a build by an older edgeomni"), id="issue14"),
    pytest.param(
        Fault(user_files_in_build, BAD, f"did not write: predictions.json, results/; {REFUSED}"),
        id="user-files-in-build",
    ),
    pytest.param(
        Fault(changed_file, BAD, "files changed since edge-build wrote them: chat_template.jinja"),
        id="changed-file",
    ),
    pytest.param(
        Fault(old_build, BAD, "older edgeomni (it has no edgeomni_manifest.json)"), id="old-build"
    ),
    pytest.param(
        Fault(old_build_without_graph, BAD, "looks like a build by an older edgeomni"),
        id="old-build-without-graph",
    ),
    pytest.param(Fault(symlink_in_build, BAD, "did not write: latest;"), id="symlink"),
    pytest.param(
        Fault(
            many_user_files, BAD, ", ".join(f"note{i:02}.txt" for i in range(10)) + ", and 2 more;"
        ),
        id="many-user-files",
    ),
    pytest.param(
        Fault(unreadable_manifest, BAD, "edgeomni_manifest.json that cannot be read"),
        id="unreadable-manifest",
    ),
    pytest.param(
        Fault(manifest_leading_out, BAD, "manifest.json that has no valid list of files"),
        id="manifest-leads-out",
    ),
    pytest.param(Fault(engine_dir_is_a_file, BAD, "exists and is not a directory"), id="eng-file"),
    pytest.param(Fault(parent_is_a_file, BAD, "f is not a directory"), id="parent-is-a-file"),
    pytest.param(Fault(workspace_path_taken, BAD, "cannot write in"), id="workspace-path-taken"),
    pytest.param(
        Fault(own_build, OK, "wrote", changes=("eng",), exports=True, after=rebuilt),
        id="own-build-is-rebuilt",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        Fault(hand_written_graph, OK, "wrote", GRAPH_ONLY_WRITES, after=graph_kept_aside),
        id="graph-only-keeps-a-hand-written-graph",
    ),
    pytest.param(
        Fault(own_graph, OK, "wrote", GRAPH_ONLY_WRITES, after=no_orig), id="graph-only-own-graph"
    ),
    pytest.param(Fault(no_graph_possible, BAD, "tensor-parallel"), id="graph-only-no-graph"),
    pytest.param(
        Fault(
            foreign_engines_given_a_graph, BAD, "did not write: chat_template.jinja, config.json"
        ),
        id="graph-only-then-build",
    ),
    pytest.param(Fault(no_tokenizer, BAD, "no tokenizer.json"), id="no-tokenizer"),
    pytest.param(
        Fault(prompt_longer_than_cache, BAD, "--max-input-len 64 exceeds --max-kv-cache-capacity"),
        id="input-longer-than-cache",
    ),
    pytest.param(Fault(omni_without_speakers, BAD, "lists no speakers"), id="omni-no-speakers"),
    pytest.param(
        Fault(omni_without_processor, BAD, "no image processor settings"), id="omni-no-processor"
    ),
    pytest.param(
        Fault(
            disk_full, cli.EXIT_FAILED, "edge-build: error: [Errno 28] No space left", exports=True
        ),
        id="disk-full",
    ),
    pytest.param(
        Fault(
            bug_in_export,
            cli.EXIT_FAILED,
            "internal error: TypeError: unsupported operand",
            exports=True,
        ),
        id="internal-error",
    ),
    pytest.param(Fault(zero_batch, BAD, "--max-batch-size must be at least 1"), id="zero-batch"),
    pytest.param(Fault(unknown_component, BAD, "unknown talker"), id="unknown-component"),
    pytest.param(Fault(no_checkpoint, BAD, "no such checkpoint directory"), id="no-checkpoint"),
    *ISSUE_30,
    *ISSUE_50,
]


def no_export(*args: object, **kwargs: object) -> None:
    pytest.fail("the export ran, though this fault needs only the cheap checks")


@pytest.mark.parametrize("fault", FAULTS)
def test_faults(
    fault: Fault, tmp_path: Path, request, monkeypatch, capsys, caplog, qwen3_ckpt, qwen3_engine
) -> None:
    """qwen3_engine is asked for here, so the session builds it before the export is barred."""
    from edgeomni.export.registry import families

    if not fault.exports:
        for family in families():
            monkeypatch.setattr(family.hooks(), "export_component", no_export)
    caplog.set_level(logging.INFO, logger="edge-build")
    env = Env(tmp_path, request, monkeypatch, caplog)
    argv = fault.setup(env)
    capsys.readouterr()
    before = snapshot(tmp_path, fault.changes)
    try:
        code = fault.command(argv)
    except SystemExit as e:  # argparse's exit for a bad argument
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == fault.code, err
    assert fault.message.replace("TMP", str(tmp_path)) in err
    assert "Traceback" not in err
    if code != OK:
        assert [line for line in err.splitlines() if "error" in line] == [err.splitlines()[-1]]
    assert snapshot(tmp_path, fault.changes) == before
    assert not [p for p in tmp_path.rglob("*edge-build-*") if p.is_dir()]  # no workspace left
    if fault.after:
        fault.after(env)


# a checkpoint's text files -> what the build's check says, and what edge-infer's TextTokenizer
# says of the same files as the stage folder holds them: the two must agree
TEXT_VARIANTS = {
    "as-made": {},
    "tojson-and-raise": {"chat_template.jinja": "{{ messages | tojson(indent=2) }}"
                         "{% if false %}{{ raise_exception('no') }}{% endif %}"},
    "syntax": {"chat_template.jinja": "{% for m in messages %}{{ m }"},
    # jinja2 looks a test up when it renders: a request then fails alone, as in edge-infer
    "unknown-test": {"chat_template.jinja": "{% if messages is nosuchtest %}{% endif %}"},
    # transformers' {% generation %} blocks: their bodies, at build and at run time alike
    "generation-tag": {"chat_template.jinja": "{% generation %}x{% endgeneration %}"},
    "unknown-tag": {"chat_template.jinja": "{% nosuchtag %}x{% endnosuchtag %}"},
    "not-utf8": {"chat_template.jinja": b"\xff"},
    "tokenizer-a-list": {"tokenizer.json": "[]"},
    "config-a-list": {"tokenizer_config.json": "[]"},
}  # fmt: skip


@pytest.mark.parametrize("name", list(TEXT_VARIANTS))
def test_the_build_opens_text_files_as_edge_infer_does(
    name: str, qwen3_ckpt: Path, tmp_path: Path
) -> None:
    from edgeomni.export.common import artifacts
    from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint
    from edgeomni.runtime.artifacts import ArtifactError
    from edgeomni.runtime.tokenizer import TextTokenizer

    ckpt = shutil.copytree(qwen3_ckpt, tmp_path / "ckpt")
    for file, text in TEXT_VARIANTS[name].items():
        (ckpt / file).write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        artifacts.require_tokenizer(open_checkpoint(ckpt))
        builds = True
    except CheckpointError:
        builds = False
    stage = tmp_path / "stage"  # the files under the names the stage folder gives them
    stage.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(ckpt / file, stage / file)
    try:
        TextTokenizer(stage)
        opens = True
    except ArtifactError:
        opens = False
    assert builds == opens == (
        name in ("as-made", "tojson-and-raise", "unknown-test", "generation-tag")
    )
    if builds:  # and what the build writes opens too
        out = tmp_path / "out"
        out.mkdir()
        artifacts.write_tokenizer(open_checkpoint(ckpt), out)
        assert TextTokenizer(out).has_chat_template


def test_each_family_names_its_position_limits(
    qwen3_ckpt: Path, omni_ckpt: Path, tts_base_ckpt: Path, logs
) -> None:
    """The decoders whose cache --max-kv-cache-capacity sizes, and one line past any limit."""
    from edgeomni.builder.build import warn_position_limits
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import family_for

    talker = ("talker_config.text_config.max_position_embeddings", 4096)
    cases = [
        (qwen3_ckpt, {"llm": ("max_position_embeddings", 1024)}, 1024, ""),
        (omni_ckpt, {"llm": ("thinker_config.text_config.max_position_embeddings", 2048),
                     "talker": talker}, 3000, "llm 2048 (thinker_config.text_config."
         "max_position_embeddings); the model"),
        (tts_base_ckpt, {"talker": ("talker_config.max_position_embeddings", 32768)}, 32769,
         "talker 32768 (talker_config.max_position_embeddings); the model"),
    ]  # fmt: skip
    for path, limits, capacity, warned in cases:
        ckpt = open_checkpoint(path)
        hooks = family_for(ckpt.model_type).hooks()
        components = hooks.components(ckpt)
        assert hooks.position_limits(ckpt, components) == limits
        logs.clear()
        warn_position_limits(hooks, ckpt, components, BuildArgs(1, 16, capacity))
        said = [r.getMessage() for r in logs.records]
        start = f"--max-kv-cache-capacity {capacity} is past the model's position limit: "
        assert len(said) == bool(warned) and all(m.startswith(start + warned) for m in said)


def test_big_files_are_checked_by_size_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(manifest, "HASH_LIMIT", 8)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "engine.onnx").write_bytes(b"0123456789")
    (tmp_path / "config.json").write_text("{}")
    files = manifest.record(tmp_path)
    assert files["sub/engine.onnx"] == {"size": 10}
    assert set(files["config.json"]) == {"size", "sha256"}
    (tmp_path / "sub" / "engine.onnx").write_bytes(b"9876543210")  # same size: not hashed
    (tmp_path / "config.json").write_text("[]")  # same size, but hashed
    assert manifest.changed(tmp_path, files) == ["config.json"]
    (tmp_path / "sub" / "engine.onnx").unlink()  # gone: fine
    (tmp_path / "sub" / "mine.txt").write_text("x")
    assert manifest.changed(tmp_path, files) == ["config.json"]
    assert manifest.foreign(tmp_path, files) == ["sub/mine.txt"]
