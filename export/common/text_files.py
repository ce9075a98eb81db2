"""A checkpoint's tokenizer and chat template, opened before any export the way edge-infer will
open what the build copies (runtime/tokenizer.py's TextTokenizer), so a checkpoint that builds
is one whose text stage edge-infer opens.

The runtime's loading is mirrored here, not imported (the export layer sits below the runtime):
tokenizer.json through ``tokenizers.Tokenizer.from_file``, tokenizer_config.json as a JSON
object, the chat template compiled by jinja2's ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks (a template's syntax, and the names of its filters and tests, are checked at
compile time). tests/test_build_faults.py holds the two to the same verdicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, read_json

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def load_tokenizer(path: Path) -> Any:
    """tokenizer.json as the runtime loads it; a CheckpointError naming the file otherwise."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own exception type
        raise CheckpointError(f"{path}: not a tokenizer file ({e})") from None


def tokenizer_config(folder: Path) -> dict[str, Any]:
    """tokenizer_config.json (empty when absent): a JSON object, as the runtime requires."""
    path = folder / TOKENIZER_CONFIG
    return read_json(path) if path.is_file() else {}


def chat_template(folder: Path) -> tuple[str | None, str]:
    """The chat template edge-build copies and where it is: chat_template.jinja, else
    chat_template.json's ``chat_template`` (a processor's, which transformers prefers to the
    tokenizer's), else tokenizer_config.json's (a string, or named templates: the default).
    A template that is there but not text is a CheckpointError."""
    jinja, processor = (folder / name for name in TEMPLATE_FILES)
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), jinja.name
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{jinja}: cannot be read ({e})") from None
    if processor.is_file():
        where, value = (
            f"{processor.name}: chat_template",
            read_json(processor).get("chat_template"),
        )
    else:
        where = f"{TOKENIZER_CONFIG}: chat_template"
        value = tokenizer_config(folder).get("chat_template")
    if isinstance(value, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        where, value = f"{where} 'default'", named.get("default")
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"{folder / where}: not a string but {type(value).__name__}")
    return value or None, where


def generation_block() -> Any:
    """The jinja2 extension of transformers' ``{% generation %}...{% endgeneration %}`` tag
    (it marks the assistant's tokens for training masks): rendered as its body, as
    transformers renders it. The runtime compiles templates with it too."""
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return GenerationBlock


def compile_template(text: str) -> Any:
    """The template compiled as the runtime compiles it (runtime/tokenizer.py's _compile);
    jinja2's TemplateSyntaxError when it does not parse."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[generation_block()]
    )
    env.globals["raise_exception"] = lambda message: None
    return env.from_string(text)


def check_text_files(ckpt: Checkpoint) -> None:
    """tokenizer.json, tokenizer_config.json and the chat template, each opened as edge-infer
    opens the copies: a CheckpointError naming the file (and the template's line) otherwise."""
    from jinja2 import TemplateSyntaxError

    path = ckpt.path / TOKENIZER
    if not path.is_file():
        raise CheckpointError(
            f"{ckpt.path}: no {TOKENIZER}; edge-infer needs a fast (tokenizers) tokenizer"
        )
    load_tokenizer(path)
    tokenizer_config(ckpt.path)
    text, where = chat_template(ckpt.path)
    if text is None:
        return
    try:
        compile_template(text)
    except TemplateSyntaxError as e:
        raise CheckpointError(
            f"{ckpt.path / where}: the chat template does not parse: line {e.lineno}: {e.message}"
        ) from None
