"""The soak (bench/soak.py) in short, on the session's tiny builds of every family: 20 s of
open-loop mixed traffic at the servers' limits (chat, spoken chat, speech, transcription, image
chat; streamed and whole; clients that leave; bad bodies; bursts of 10 at once every 5 s, so
429s come however fast the machine is), then the same through
edge-serve --ray with a replica killed halfway. Nothing is lost: no timeout and no 5xx (but the
killed replica's own requests, each with a clear status), every accepted answer equals
edge-infer's, every refusal is a clear status, no request or media folder is left, and each
server exits 0 on SIGTERM with no traceback in its log. (Memory is judged by the full soak
only: 20 s is no warm-up.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import soak  # noqa: E402
import soak_traffic  # noqa: E402

pytestmark = pytest.mark.slow


def short(tmp_path: Path, *more: str) -> Any:
    return soak.parser().parse_args(["--engines", str(tmp_path), "--out", str(tmp_path / "out"),
                                     "--duration", "20", "--warmup", "5", "--sample-every", "1",
                                     "--no-memory-check", *more])  # fmt: skip


def verdicts(report: dict[str, Any]) -> None:
    """What every soak must show, whatever its length."""
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, default=str)
    rows = report["requests"]
    outcomes = {o: sum(r["outcome"] == o for r in rows) for o in soak_traffic.OUTCOMES}
    assert outcomes["lost"] == outcomes["error"] == outcomes["mismatch"] == 0, outcomes
    for o in ("ok", "refused", "busy", "left"):  # each kind of ending was exercised
        assert outcomes[o] > 0, outcomes
    for r in rows:  # a refusal is a 4xx with OpenAI's error message; a 429 is busy, not refused
        if r["outcome"] == "refused":
            assert 400 <= r["status"] < 500 and r["status"] != 429 and r["bad"], r
            assert isinstance(r["detail"], str) and r["detail"], r
        if r["outcome"] == "busy":
            assert r["status"] == 429, r
        if r["outcome"] == "ok":
            assert r["status"] == 200 and not r["bad"], r
    assert (Path(report["settings"]["out"]) / "soak.json").is_file()


def test_soak_of_every_family(qwen3_engine: Path, omni_engine: Path, tts_engine: Path,
                              asr_engine: Path, vl_engine: Path, tmp_path: Path) -> None:  # fmt: skip
    engines = {"qwen3": qwen3_engine, "qwen3_omni_moe": omni_engine, "qwen3_tts": tts_engine,
               "qwen3_asr": asr_engine, "qwen3_vl": vl_engine}  # fmt: skip
    report = soak.run(engines, short(tmp_path, "--rate", "10", "--burst", "10", "--max-queue", "1"))
    verdicts(report)
    assert set(report["summary"]) == set(engines)
    assert all(s["ok"] > 0 for s in report["summary"].values()), report["summary"]
    audio = [r for r in report["requests"] if r["outcome"] == "ok" and "audio_diff" in r]
    assert {r["family"] for r in audio} == {"qwen3_omni_moe", "qwen3_tts"}
    assert all(r["audio_diff"] <= soak_traffic.AUDIO_STEPS for r in audio)


def test_soak_through_ray_with_a_replica_killed(omni_engine: Path, tmp_path: Path) -> None:
    """The tiny Qwen3-Omni split in two deployments (thinker; talker and code2wav, two
    replicas), one speech replica killed with SIGKILL halfway: the requests it held fail with a
    clear status, the rest are edge-infer's, and later requests run on its replacement."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install "
                        "'edgeomni[ray]')")  # fmt: skip
    args = short(tmp_path, "--ray", "--rate", "12", "--burst", "10", "--max-queue", "1")
    report = soak.run({"qwen3_omni_moe": omni_engine}, args)
    verdicts(report)
    (kill,) = report["kills"]
    assert kill["found"] and kill["group"] == "tail"
    after = [r for r in report["requests"] if r["start"] > kill["t"] + soak.REPLICA_GRACE_S / 3]
    assert any(r["outcome"] == "ok" for r in after), "nothing ran after the kill"
    for r in report["requests"]:
        if r["outcome"] == "replica":  # the killed replica's: a clear status, near the kill
            assert r["failed"] and r["start"] <= kill["t"] + soak.REPLICA_GRACE_S, r
