"""A seeded fuzz of request files through edge-infer: whatever a file holds, the run ends with
exit 0, 2 or 3, one clear line for a bad file, predictions for every request otherwise, and
never a traceback.

Each case starts from a valid file and mutates it: values of other types, unicode (astral
characters, lone surrogates as JSON spells them, invalid UTF-8 bytes in the file), huge and empty
values, unknown keys, nested parts, keys removed. The cases are fixed by the seed; the loop stops
early past its time budget so CI stays within a minute.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from edgeomni.runtime import cli

SEED, CASES, BUDGET_S = 30, 400, 60.0

BASE: dict[str, Any] = {
    "max_generate_length": 3,
    "top_k": 1,
    "requests": [
        {"messages": [{"role": "user", "content": "Hello there"}]},
        {"prompt": "The quick brown fox", "sampling": {"temperature": 0.7, "seed": 3}},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
         "stop": ["."], "reference": "an answer", "num_logprobs": 2},
    ],
}  # fmt: skip

ODD_TEXT = ["", " ", "x\udc80y", "\ud800", "\udfff tail", "😀 astral", "\x00nul", "\u202eRTL",
            "a" * 20000, "é" * 300, "\n\t", "{{ raise_exception('x') }}", "<|im_end|>"]  # fmt: skip
ODD_VALUES: list[Any] = [None, True, False, 0, -1, 1.5, float("inf"), 10**30, -(10**30), "",
                         "text", [], {}, [1, "a", None], {"a": {"b": [{}]}},
                         {"type": "text", "text": "nested"}, [[[[]]]]]  # fmt: skip


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every path (keys and indexes) to a value inside ``node``."""
    out = [at] if at else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*at, i))
    return out


def _get(node: Any, path: tuple) -> Any:
    for step in path:
        node = node[step]
    return node


def mutate(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    """One to three random changes to a copy of ``doc``."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(doc))
        parent, last = _get(doc, path[:-1]), path[-1]
        action = rng.randrange(7)
        if action == 0:  # another type
            parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif action == 1:  # odd text
            parent[last] = rng.choice(ODD_TEXT)
        elif action == 2 and isinstance(parent, dict):  # a key removed
            del parent[last]
        elif action == 3 and isinstance(parent, dict):  # an unknown (or odd) key
            parent[rng.choice(["temprature", "_note", "x\udc80", "", "messages", "top_k"])] = 1
        elif action == 4:  # nested deeper
            parent[last] = [{"type": "text", "text": parent[last]}, [parent[last]]]
        elif action == 5:  # huge
            parent[last] = [copy.deepcopy(parent[last])] * 200 if rng.random() < 0.5 else 10**9
        else:  # empty
            parent[last] = rng.choice(["", [], {}])
    return doc


def encode(rng: random.Random, doc: dict[str, Any]) -> bytes:
    """The file's bytes: JSON (escaping what UTF-8 cannot hold), sometimes with a byte that
    is not UTF-8 or a cut."""
    data = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.08:
        cut = rng.randrange(len(data))
        data = data[:cut] + b"\xe9" + data[cut:]
    elif roll < 0.12:
        data = data[: rng.randrange(len(data))]
    return data


@pytest.mark.slow
def test_fuzzed_request_files(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    rng = random.Random(SEED)
    start, seen = time.monotonic(), {0: 0, 2: 0, 3: 0}
    for case in range(CASES):
        if time.monotonic() - start > BUDGET_S:
            break
        doc = mutate(rng, BASE)
        folder = tmp_path / f"c{case}"
        folder.mkdir()
        req, out = folder / "r.json", folder / "p.json"
        req.write_bytes(encode(rng, doc))
        capsys.readouterr()
        code = cli.main(["--config", str(qwen3_engine), "--input-file", str(req),
                         "--output-file", str(out), "--sampling", '{"top_k": 1}'])  # fmt: skip
        err = capsys.readouterr().err
        where = f"case {case}: {req.read_bytes()[:300]!r}\n{err}"
        assert code in seen, where
        seen[code] += 1
        assert "Traceback" not in err and "internal error" not in err, where
        if code == 2:
            assert err.count("edge-infer: error:") == 1, where
            assert not out.exists(), where
            continue
        entries = json.loads(out.read_bytes().decode("utf-8"))["responses"]
        assert len(entries) == len(doc["requests"]), where
        assert [e["request_idx"] for e in entries] == list(range(len(entries))), where
        assert all(isinstance(e["ok"], bool) for e in entries), where
        assert (code == 0) == all(e["ok"] for e in entries), where
    # the seed reaches every outcome, so the loop checks each kind of ending
    assert all(seen.values()), seen
