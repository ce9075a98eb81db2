"""Prepares onnxruntime-gpu for the lent GPU machine in parts small enough to carry beside this
checkout: one device call carries at most 64 MiB, working tree included, and the tree (docs/
with its raw GPU files) is too large now for ../shared/gpu/stage-ort-gpu.sh's 56 MiB parts.

The wheel is ~256 MB, most of it its CUDA provider's cubins for every architecture (sm_75 to
sm_120). For one architecture (the H100's and H200's sm_90 by default) the others are zeroed
in place: each fatbin's entries are walked (a 16-byte header, magic 0xBA55ED50, then entries of
kind, header size, payload size and architecture) and every payload of another architecture is
overwritten with zeros, which the driver never loads on this GPU and xz squeezes to nothing.
The unpacked wheel goes into one tar.xz (~70 MB for 1.31.1 at sm_90), split into parts that fit
a call beside the tree, under .gpu/o/ (git ignores .gpu/), with install.sh.

    python bench/stage_ort_sm90.py [--wheel FILE] [--version 1.31.1] [--arch 90]

Then one device call per part, back to back (the machine stays warm ~30 s between calls):
    command: mkdir -p /tmp/stage && cp .gpu/o/ort_NN /tmp/stage/     carry: [".gpu/o/ort_NN"]
and in the last call `bash .gpu/o/install.sh` (carry the last part and .gpu/o/install.sh);
later commands start with `export PYTHONPATH=/tmp/site:...`. Its CUDA provider loads only on
GPUs of that architecture.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MAGIC = 0xBA55ED50
CARRY_MIB = 64
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"


def zero_other_archs(data: bytearray, arch: int) -> tuple[int, int]:
    """Zero every fatbin payload not built for ``arch``; returns (bytes zeroed, bytes kept)."""
    magic, zeroed, kept, pos = struct.pack("<I", MAGIC), 0, 0, data.find(struct.pack("<I", MAGIC))
    while pos != -1:
        version, header, size = struct.unpack_from("<HHQ", data, pos + 4)
        if version != 1 or header != 16:  # the magic's bytes inside other data
            pos = data.find(magic, pos + 4)
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            entry_header = struct.unpack_from("<I", data, entry + 4)[0]
            payload = struct.unpack_from("<Q", data, entry + 8)[0]
            start = entry + entry_header
            if struct.unpack_from("<I", data, entry + 28)[0] == arch:
                kept += payload
            else:
                data[start : start + payload] = bytes(payload)
                zeroed += payload
            entry = start + payload
        if entry != end:
            raise SystemExit(f"a fatbin at {pos:#x} does not end where its header says")
        pos = data.find(magic, end)
    if not kept:
        raise SystemExit(f"no sm_{arch} code in {PROVIDER}: nothing would run there")
    return zeroed, kept


def tree_bytes(root: Path) -> int:
    """What a device call carries of this checkout: tracked and untracked, unignored files."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                           check=True, capture_output=True).stdout.split(b"\0")  # fmt: skip
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--wheel", type=Path, help="an onnxruntime-gpu wheel (default: downloaded)")
    p.add_argument("--version", default="1.31.1")
    p.add_argument("--arch", type=int, default=90, help="the GPU's compute capability (sm_90)")
    args = p.parse_args()
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                               capture_output=True, text=True).stdout.strip())  # fmt: skip
    out = root / ".gpu" / "o"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary=:all:", "--python-version", "3.12",
                            "--platform", "manylinux_2_28_x86_64", "--platform",
                            "manylinux_2_27_x86_64", "-d", tmp,
                            f"onnxruntime-gpu=={args.version}"], check=True)  # fmt: skip
            wheel = next(Path(tmp).glob("onnxruntime_gpu-*.whl"))
        site = Path(tmp) / "site"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        lib = site / PROVIDER
        data = bytearray(lib.read_bytes())
        zeroed, kept = zero_other_archs(data, args.arch)
        lib.write_bytes(data)
        print(f"{PROVIDER}: {zeroed / 1e6:.1f} MB of other architectures zeroed, "
              f"{kept / 1e6:.1f} MB of sm_{args.arch} kept")
        archive = Path(tmp) / "ort.tar.xz"
        with lzma.open(archive, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
            tar.add(site, arcname=".")
        blob = archive.read_bytes()
    for old in out.glob("ort_*"):
        old.unlink()
    room = CARRY_MIB * 2**20 - tree_bytes(root) - 2**20  # a MiB for scripts beside it
    if room < 4 * 2**20:
        raise SystemExit(f"the checkout leaves {room / 2**20:.1f} MiB of a device call: too little")
    parts = [blob[i : i + room] for i in range(0, len(blob), room)]
    for k, part in enumerate(parts):
        (out / f"ort_{k:02d}").write_bytes(part)
    digest = hashlib.sha256(blob).hexdigest()
    names = " ".join(f"ort_{k:02d}" for k in range(len(parts)))
    (out / "install.sh").write_text(
        "# runs on the GPU machine once every part is in /tmp/stage (bench/stage_ort_sm90.py)\n"
        "set -euo pipefail\ncd /tmp/stage\n"
        f"cat {names} > ort.tar.xz\necho '{digest}  ort.tar.xz' | sha256sum -c -\n"
        "mkdir -p /tmp/site && tar -xJf ort.tar.xz -C /tmp/site\n"
        "PYTHONPATH=/tmp/site python3 -c 'import onnxruntime as o; "
        "print(o.__version__, o.get_available_providers())'\n")  # fmt: skip
    print(f"{len(blob) / 2**20:.1f} MiB in {len(parts)} parts of at most {room / 2**20:.1f} MiB "
          f"under {out}; then bash .gpu/o/install.sh there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
