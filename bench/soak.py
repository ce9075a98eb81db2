"""A soak of edge-serve: one server per family (tiny builds), open-loop mixed traffic at their
limits for a bounded time, and nothing lost.

    python bench/soak.py --engines ENGS --duration 600 --out OUT
    python bench/soak.py --engines ENGS --duration 300 --ray --families qwen3_omni_moe qwen3_tts \\
        --out OUT

``--engines`` holds (or gets, built once and reused: bench/soak_engines.py) the tiny random
build of each family: qwen3 (chat), qwen3_omni_moe (spoken chat, audio in), qwen3_tts
(/v1/audio/speech), qwen3_asr (/v1/audio/transcriptions), qwen3_vl (image chat). Each runs in
an edge-serve process of its own on a free loopback port (``--ray``: through Ray Serve, the
graph split in two groups, the last with two replicas, one of which is killed with SIGKILL
halfway). This process sends Poisson arrivals (``--rate`` a second per family, above what
two rows and ``--max-queue`` waiting take, so some are turned away with 429) drawn from each
family's request templates (bench/soak_traffic.py: streamed and whole, clients that leave
mid-stream or give up, bad bodies), and judges every answer against edge-infer's for the
same request. Meanwhile it samples each server's resident memory and open files
(/proc/PID/status, /proc/PID/fd; ``--ray``: the replicas too).

Checks, each printed and written to OUT/soak.json (with every request, every sample, the
settings and the machine): no request lost or answered 5xx (``--ray``: outside the killed
replica's requests), no mismatch, every refusal a clear status (OpenAI's JSON error; 429 with
Retry-After); after the traffic each server holds no request and no request media folder; after
SIGTERM each exits 0 and leaves no edge-serve folder in its temp dir (nor a process); resident
memory at the end within ``RSS_GROWTH`` of the window after warm-up, open files idle after the
traffic within ``FD_GROWTH`` of that window. Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import soak_traffic as tr  # noqa: E402
from serve_load import free_port, percentile, wait_healthy  # noqa: E402
from soak_engines import FAMILIES, ensure_engines  # noqa: E402

RSS_GROWTH = (0.05, 16 << 20)  # end vs after warm-up: at most 5% or 16 MiB more, the larger
FD_GROWTH = 4  # open files idle after the traffic: at most this many more than after warm-up
# (not "before the traffic": under --ray the front and the replicas open their connections to
# each other with the first requests)
REPLICA_GRACE_S = 15.0  # after a kill, requests that fail with a clear status count as its own
BURST_EVERY_S = 5.0  # between --burst cohorts, per family


def proc_children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    tree, out, todo = proc_children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")  # fmt: skip
    except OSError:
        return ""


def usage(pid: int) -> tuple[int, int] | None:
    """(resident bytes, open files) of a process, or None once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return rss * 1024, fds


def placement(engine: Path) -> tuple[dict[str, Any], str]:
    """A placement splitting the graph in two groups (the first stage; the rest, two
    replicas), or one group of two replicas: the file's body and the group to kill in."""
    stages = [s["id"] for s in json.loads((engine / "multistage_config.json").read_text())[
        "stages"]]  # fmt: skip
    if len(stages) == 1:
        return {"groups": [{"name": "all", "stages": stages, "replicas": 2,
                            "num_cpus": 0.25}]}, "all"  # fmt: skip
    return {"groups": [{"name": "head", "stages": stages[:1], "num_cpus": 0.25},
                       {"name": "tail", "stages": stages[1:], "replicas": 2,
                        "num_cpus": 0.25}]}, "tail"  # fmt: skip


class Served:
    """One family's edge-serve process, its temp dir (TMPDIR, so its media folders are
    found), log and the processes it started."""

    def __init__(self, family: str, engine: Path, root: Path, out: Path, a: argparse.Namespace):
        self.family, self.engine = family, engine
        self.tmp = root / family[:8]
        self.tmp.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = out / f"server-{family}{'-ray' if a.ray else ''}.log"
        self.cmd = [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(engine),
                    "--port", str(self.port), "--max-queue", str(a.max_queue), "--threads", "1",
                    "--max-tokens", str(tr.MAX_TOKENS), "--max-audio-seconds",
                    str(tr.MAX_AUDIO_S), "--max-image-pixels", str(tr.MAX_PIXELS)]  # fmt: skip
        self.kill_group, self.placement = None, None
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        if a.ray:
            self.placement, self.kill_group = placement(engine)
            where = root / f"placement-{family}.json"
            where.write_text(json.dumps(self.placement))
            self.cmd += ["--ray", "--ray-cpus", "2", "--placement", str(where)]
            env["RAY_AUTH_MODE"] = "disabled"
        self.seen: set[int] = set()  # every process of its tree sampled
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("w"), env=env)  # fmt: skip
        self.rc: int | None = None

    def processes(self) -> dict[int, str]:
        """pid -> role: the front (edge-serve) and, under --ray, each Ray Serve replica."""
        out = {self.proc.pid: "front"}
        if self.kill_group is not None:
            for pid in descendants(self.proc.pid):
                line = cmdline(pid)
                if "ServeReplica:" in line:  # ray::ServeReplica:APP:DEPLOYMENT[.method]
                    name = line.split("ServeReplica:", 1)[1].split()[0].split(".")[0]
                    out[pid] = "replica " + name.rsplit(":", 1)[-1]
        return out

    def replica_to_kill(self) -> int | None:
        want = f"replica edgeomni-{self.kill_group}"
        return next((pid for pid, role in sorted(self.processes().items()) if role == want),
                    None)  # fmt: skip

    def media_left(self) -> list[str]:
        """Request media folders in the server's media root (while it runs)."""
        return sorted(str(p.relative_to(self.tmp)) for p in self.tmp.glob("edge-serve-media-*/*"))

    def folders_left(self) -> list[str]:
        """edge-serve's folders in its temp dir (once it has stopped)."""
        return sorted(p.name for pattern in ("edge-serve-*", "edgeomni-group-media-*")
                      for p in self.tmp.glob(pattern))  # fmt: skip

    def stop(self, timeout: float = 120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
        return self.rc


class Sampler(threading.Thread):
    """Every ``every`` seconds, each server's processes' resident memory and open files."""

    def __init__(self, servers: list[Served], t0: float, every: float) -> None:
        super().__init__(daemon=True)
        self.servers, self.t0, self.every = servers, t0, every
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()

    def sample(self) -> None:
        t = round(time.perf_counter() - self.t0, 2)
        for s in self.servers:
            for pid, role in s.processes().items():
                got = usage(pid)
                if got is not None:
                    s.seen.add(pid)
                    self.samples.append({"t": t, "family": s.family, "role": role, "pid": pid,
                                         "rss": got[0], "fds": got[1]})  # fmt: skip

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.sample()


async def traffic(servers: list[Served], temps: dict[str, list[tr.Template]],
                  a: argparse.Namespace, t0: float, kills: list[dict]) -> list[dict[str, Any]]:  # fmt: skip
    """Every family's Poisson arrivals for ``a.duration`` seconds, each sent when due without
    waiting for earlier ones, plus (``--burst K``) K arrivals at once every ``BURST_EVERY_S``;
    (``--ray``) one replica of each server killed halfway."""
    import httpx

    rows: list[dict[str, Any]] = []
    # idle connections dropped well before uvicorn's 5 s keep-alive closes them: at equal
    # timeouts a request sent on a connection the server is closing reads nothing (ReadError),
    # which the soak would count as an answer the server lost
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64, keepalive_expiry=2)

    async def one(client: Any, s: Served, t: tr.Template, at: float, leave: float | None) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        start = time.perf_counter()
        got = await tr.send(client, s.url, t, a.timeout, leave)
        end = time.perf_counter()
        rows.append({"family": s.family, "template": t.name, "stream": t.stream,
                     "bad": t.bad, "give_up_s": leave, "due": round(at, 3),
                     "start": round(start - t0, 3), "end": round(end - t0, 3),
                     "latency_ms": round((end - start) * 1e3, 1), **got})  # fmt: skip

    async def kill(s: Served) -> None:
        await asyncio.sleep(max(0.0, t0 + a.duration / 2 - time.perf_counter()))
        pid = s.replica_to_kill()
        at = time.perf_counter() - t0
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        kills.append({"family": s.family, "pid": pid, "t": round(at, 3),
                      "group": s.kill_group, "found": pid is not None})  # fmt: skip

    async with httpx.AsyncClient(timeout=a.timeout, limits=limits) as client:
        jobs = []
        for i, s in enumerate(servers):
            rng = random.Random(a.seed * 1000 + i)
            at = rng.expovariate(a.rate)
            while at < a.duration:
                t, leave = tr.pick(rng, temps[s.family])
                jobs.append(one(client, s, t, at, leave))
                at += rng.expovariate(a.rate)
            burst_rng, at = random.Random(a.seed * 1000 + 500 + i), BURST_EVERY_S / 2
            while a.burst and at < a.duration:  # K arrivals due at once: the limits, surely
                for _ in range(a.burst):
                    t, leave = tr.pick(burst_rng, temps[s.family])
                    jobs.append(one(client, s, t, at, leave))
                at += BURST_EVERY_S
            if s.kill_group is not None:
                jobs.append(kill(s))
        await asyncio.gather(*jobs)
    return rows


def attribute_kills(rows: list[dict[str, Any]], kills: list[dict]) -> None:
    """A request that failed with a clear status (a 5xx JSON error, an error in its stream)
    while it was in flight at a kill or began within ``REPLICA_GRACE_S`` after it: the killed
    replica's (``replica``)."""
    for k in kills:
        for r in rows:
            if (r["family"] == k["family"] and r["outcome"] == "error" and r.get("failed")
                    and r["start"] <= k["t"] + REPLICA_GRACE_S and r["end"] >= k["t"]):  # fmt: skip
                r["outcome"] = "replica"


def window(samples: list[dict], lo: float, hi: float, key: str) -> float | None:
    xs = [s[key] for s in samples if lo <= s["t"] <= hi]
    return median(xs) if xs else None


def slope(samples: list[dict], after: float, key: str) -> float | None:
    """Least-squares growth of ``key`` per minute over the samples after ``after`` s."""
    pts = [(s["t"], s[key]) for s in samples if s["t"] >= after]
    if len(pts) < 3:
        return None
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return None if den == 0 else 60 * sum((t - mt) * (v - mv) for t, v in pts) / den


def memory(samples: list[dict], family: str, warm: float, end: float, span: float) -> dict:
    """Per process of a server: resident memory and open files before the traffic, in the
    window after warm-up, in the last window of the traffic (medians of ``span`` s) and idle
    after it; the growth a minute after warm-up; and whether they stayed flat: resident memory
    at the end within ``RSS_GROWTH`` of the window after warm-up, open files idle after the
    traffic within ``FD_GROWTH`` of the window after warm-up (which also holds the clients'
    connections of the moment: a leak of one a request would still show)."""
    out = {}
    for pid in sorted({s["pid"] for s in samples if s["family"] == family}):
        mine = [s for s in samples if s["pid"] == pid]
        row: dict[str, Any] = {"role": mine[0]["role"], "first_t": mine[0]["t"],
                               "last_t": mine[-1]["t"]}  # fmt: skip
        for key in ("rss", "fds"):
            row[key] = {"start": mine[0][key], "warm": window(mine, warm, warm + span, key),
                        "end": window(mine, end - span, end, key),
                        "idle": mine[-1][key] if mine[-1]["t"] > end else None,
                        "per_min": slope(mine, warm, key)}  # fmt: skip
        rss, fds = row["rss"], row["fds"]
        if mine[0]["t"] > 1 or None in (rss["warm"], rss["end"], fds["idle"]):
            row["flat"] = None  # a replica killed, or its replacement: no whole run to judge
        else:
            room = max(RSS_GROWTH[0] * rss["warm"], RSS_GROWTH[1])
            row["flat"] = rss["end"] <= rss["warm"] + room and fds["idle"] <= fds["warm"] + FD_GROWTH
        out[str(pid)] = row
    return out


async def quiet(servers: list[Served], timeout: float = 30) -> dict[str, int | None]:
    """Each server's requests in flight once the traffic has ended (0 expected), from /health."""
    import httpx

    out: dict[str, int | None] = {}
    async with httpx.AsyncClient(timeout=5) as client:
        for s in servers:
            deadline = time.perf_counter() + timeout
            while True:
                try:
                    out[s.family] = (await client.get(s.url + "/health")).json()["in_flight"]
                except (httpx.HTTPError, ValueError, KeyError):
                    out[s.family] = None
                if out[s.family] == 0 or time.perf_counter() > deadline:
                    break
                await asyncio.sleep(0.5)
    return out


def summarize(rows: list[dict], family: str) -> dict[str, Any]:
    mine = [r for r in rows if r["family"] == family]
    counts = {o: sum(r["outcome"] == o for r in mine) for o in tr.OUTCOMES}
    ok = [r["latency_ms"] for r in mine if r["outcome"] == "ok"]
    busy = [r["latency_ms"] for r in mine if r["outcome"] == "busy"]
    audio = [r["audio_exact"] for r in mine if r["outcome"] == "ok" and "audio_exact" in r]
    diffs = [r["audio_diff"] for r in mine if r["outcome"] == "ok" and "audio_diff" in r]
    return {"requests": len(mine), **counts,
            "ok_p50_ms": round(percentile(ok, 0.5), 1), "ok_p95_ms": round(percentile(ok, 0.95), 1),
            "busy_p50_ms": round(percentile(busy, 0.5), 1),
            "audio_exact": f"{sum(audio)}/{len(audio)}" if audio else "-",
            "audio_max_steps": max(diffs, default=None)}  # fmt: skip


def run(engines: dict[str, Path], a: argparse.Namespace) -> dict[str, Any]:
    """The soak over ``engines`` (family -> engine dir) with the settings of ``a``: the report
    (what OUT/soak.json holds), its ``checks`` and ``passed``."""
    a.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))  # short: Ray's socket paths
    temps = {}
    for family, engine in engines.items():
        temps[family] = tr.templates(family, root / "media" / family)
        tr.compute_expected(engine, temps[family])
    servers = [Served(f, e, root, a.out, a) for f, e in engines.items()]
    kills: list[dict] = []
    sampler = None
    try:
        for s in servers:
            wait_healthy(s.url, s.proc, s.log, timeout=600)
        t0 = time.perf_counter()
        sampler = Sampler(servers, t0, a.sample_every)
        sampler.sample()
        sampler.start()
        rows = asyncio.run(traffic(servers, temps, a, t0, kills))
        traffic_end = time.perf_counter() - t0
        in_flight = asyncio.run(quiet(servers))
        sampler.halt.set()
        sampler.join()
        sampler.sample()  # idle, after the traffic
        media = {s.family: s.media_left() for s in servers}
    finally:
        if sampler is not None:
            sampler.halt.set()
        for s in servers:
            if s.proc.poll() is None:
                s.stop()
        time.sleep(2)  # Ray's processes end after the front has
        left_procs = {s.family: sorted(p for p in s.seen if usage(p) is not None) for s in servers}
        folders = {s.family: s.folders_left() for s in servers}
        shutil.rmtree(root, ignore_errors=True)
    attribute_kills(rows, kills)
    warm = min(a.warmup, a.duration / 2)
    span = max(a.sample_every * 3, min(60.0, a.duration / 10))
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
        "cpus": os.cpu_count(), "python": sys.version.split()[0], "command": " ".join(sys.argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
        | {"rss_growth": RSS_GROWTH, "fd_growth": FD_GROWTH, "audio_steps": tr.AUDIO_STEPS,
           "replica_grace_s": REPLICA_GRACE_S, "warm_s": warm, "window_s": span},
        "servers": {s.family: {"command": " ".join(s.cmd), "placement": s.placement, "exit": s.rc,
                               "log_tracebacks": s.log.read_text(errors="replace").count(
                                   "Traceback")} for s in servers},
        "kills": kills, "traffic_s": round(traffic_end, 1),
        "summary": {f: summarize(rows, f) for f in engines},
        "memory": {f: memory(sampler.samples, f, warm, a.duration, span) for f in engines},
        "in_flight_after": in_flight, "media_left_running": media,
        "folders_left_stopped": folders,
        "processes_left": left_procs,
    }  # fmt: skip
    report["checks"] = checks(report, a)
    report["passed"] = all(c["ok"] for c in report["checks"])
    report["requests"] = sorted(rows, key=lambda r: (r["family"], r["start"]))
    report["samples"] = sampler.samples
    (a.out / "soak.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def checks(report: dict[str, Any], a: argparse.Namespace) -> list[dict[str, Any]]:
    """The soak's verdicts: each a name, ok, and what it saw."""
    s = report["summary"]
    out = []

    def check(name: str, ok: bool, saw: Any) -> None:
        out.append({"check": name, "ok": bool(ok), "saw": saw})

    total = {o: sum(f[o] for f in s.values()) for o in tr.OUTCOMES}
    check("nothing lost (no timeout, no dropped answer)", total["lost"] == 0, total["lost"])
    check("no 5xx or unclear answer (outside a killed replica's requests)", total["error"] == 0,
          total["error"])  # fmt: skip
    check("mismatches: 0", total["mismatch"] == 0, total["mismatch"])
    check("the servers' limits were reached (some 429)", total["busy"] > 0, total["busy"])
    check("every family answered requests in full", all(f["ok"] > 0 for f in s.values()),
          {k: f["ok"] for k, f in s.items()})  # fmt: skip
    check("no request in flight after the traffic",
          all(v == 0 for v in report["in_flight_after"].values()), report["in_flight_after"])
    check("no request media folder left while running",
          not any(report["media_left_running"].values()), report["media_left_running"])
    check("no edge-serve folder left once stopped",
          not any(report["folders_left_stopped"].values()), report["folders_left_stopped"])
    check("each server exited 0 on SIGTERM, no traceback in its log",
          all(v["exit"] == 0 and v["log_tracebacks"] == 0 for v in report["servers"].values()),
          {k: (v["exit"], v["log_tracebacks"]) for k, v in report["servers"].items()})
    check("no process of a server left once it stopped",
          not any(report["processes_left"].values()), report["processes_left"])
    if a.ray:
        check("a replica was killed in each server", all(k["found"] for k in report["kills"])
              and len(report["kills"]) == len(s), report["kills"])  # fmt: skip
    if a.check_memory:
        flat = {f: {pid: m["flat"] for pid, m in procs.items() if m["flat"] is not None}
                for f, procs in report["memory"].items()}  # fmt: skip
        check("resident memory and open files flat after warm-up",
              all(all(v.values()) and v for v in flat.values()), flat)
    return out


def table(report: dict[str, Any]) -> str:
    """The markdown tables: requests by outcome, latencies and audio per family; memory."""
    cols = ["requests", *tr.OUTCOMES]
    lines = ["| family | " + " | ".join(cols) + " | ok p50 / p95 ms | 429 p50 ms | audio exact (max steps) |",
             "|---" * (len(cols) + 4) + "|"]
    for f, s in report["summary"].items():
        lines.append(f"| {f} | " + " | ".join(str(s[c]) for c in cols) +
                     f" | {s['ok_p50_ms']} / {s['ok_p95_ms']} | {s['busy_p50_ms']} | "
                     f"{s['audio_exact']} ({s['audio_max_steps']}) |")  # fmt: skip
    lines += ["", "| family | process | RSS MiB start / after warm-up / end (MiB a minute) | "
              "open files start / after warm-up / end / idle | flat |", "|---|---|---|---|---|"]

    def mib(x: float | None, digits: int = 0) -> str:
        return "-" if x is None else f"{x / 2**20:.{digits}f}"

    for f, procs in report["memory"].items():
        for pid, m in procs.items():
            r, d = m["rss"], m["fds"]
            lines.append(f"| {f} | {m['role']} ({pid}) | {mib(r['start'])} / {mib(r['warm'])} / "
                         f"{mib(r['end'])} ({mib(r['per_min'], 2)}) | {d['start']} / {d['warm']} "
                         f"/ {d['end']} / {d['idle']} | "
                         f"{'-' if m['flat'] is None else 'yes' if m['flat'] else 'NO'} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=Path, required=True,
                   help="a folder of the families' tiny builds (missing ones are built there)")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--rate", type=float, default=8.0,
                   help="arrivals a second per family (8: past the tiny builds' limits on 2 "
                   "cores, so some get 429)")
    p.add_argument("--burst", type=int, default=0, metavar="K",
                   help=f"K more arrivals per family due at the same instant every "
                   f"{BURST_EVERY_S:g} s (past --batch-size + --max-queue, they reach the "
                   "limits however fast the machine is; Poisson arrivals alone may not)")
    p.add_argument("--max-queue", type=int, default=2, help="each server's --max-queue")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a request may take before it counts as lost")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds of traffic before the memory baseline window")
    p.add_argument("--sample-every", type=float, default=2.0,
                   help="seconds between samples of memory and open files")
    p.add_argument("--ray", action="store_true",
                   help="serve through edge-serve --ray, a replica killed halfway")
    p.add_argument("--no-memory-check", dest="check_memory", action="store_false",
                   help="report memory but do not judge it (runs too short to warm up)")
    p.add_argument("--seed", type=int, default=0, help="of the arrivals and their templates")
    p.add_argument("--out", type=Path, required=True)
    return p


def main() -> int:
    a = parser().parse_args()
    engines = ensure_engines(a.engines, tuple(a.families))
    report = run(engines, a)
    print(table(report))
    for c in report["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {json.dumps(c['saw'], default=str)}")
    print(f"wrote {a.out / 'soak.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
