#!/usr/bin/env bash
# Prepares upstream qwen-tts 0.1.1 (on the transformers it pins, 4.57.3) for the GPU machine,
# for bench/gpu_tts.py's upstream side. Modelled on ../shared/gpu/stage-ort-gpu.sh.
#
# The GPU machine reaches no package registry and one device call carries at most 64 MiB
# (working tree included). This script downloads here (pip download --no-deps, CPython 3.12,
# manylinux x86_64) what `import qwen_tts` and generate_custom_voice need and the machine
# lacks or has at other versions, packs the wheels into one tar, splits it into the fewest
# parts of at most 56 MiB under .gpu-tts/ (ignored through .git/info/exclude) and writes
# .gpu-tts/install.sh, the installer that runs there. Run it from anywhere in the checkout.
#
# Wheels, and how install.sh treats them:
#   always, into /tmp/site-qwen-tts (they shadow the image's for the upstream worker only):
#     transformers==4.57.3 and what its import-time version check wants: huggingface-hub
#     0.36.2 (<1.0), tokenizers 0.22.2 (<=0.23.0), requests (+ urllib3, idna,
#     charset-normalizer, certifi); qwen-tts 0.1.1; torchaudio 2.11.1 (qwen_tts imports
#     torchaudio.compliance.kaldi, pure Python, at import time; its lib/*.so are renamed
#     *.so.disabled when `import torchaudio` fails with them, as in
#     tests/qwen_tts_reference/make_venv.py); librosa 0.11.0 and the pure-Python deps its
#     librosa.filters import needs (joblib + cloudpickle, decorator, msgpack, lazy_loader,
#     audioread, pooch, platformdirs; scikit-learn is not imported there); einops; sox (warns
#     without the sox binary, unused by the 12 Hz model; 1.4.1 is its newest wheel, 1.5.0 an
#     sdist); soundfile + cffi + pycparser.
#   only where the image's python lacks the module (compiled against numpy; the image's own
#   build is the one that matches its numpy): scipy, numba + llvmlite (both when `import
#   numba` fails), soxr, regex, pyyaml.
#   accelerate is not staged: gpu_tts.py loads upstream on the CPU and moves it to the GPU.
#
# Then, on the GPU machine, one device call per part, back to back (it stays warm ~30 s):
#   part k (all but the last): command: mkdir -p /tmp/stage-tts && cp .gpu-tts/part_0k /tmp/stage-tts/
#                              carry:   [".gpu-tts/part_0k"]
#   the last part:             command: bash .gpu-tts/install.sh
#                              carry:   [".gpu-tts/part_0N", ".gpu-tts/install.sh"]
# (the script prints these with the real part names). The last part is small: it can ride in
# the last call of ../shared/gpu/stage-ort-gpu.sh, its carry and command extended by the ones
# above (that call then carries ~46 MB). Afterwards the upstream worker runs
# with PYTHONPATH=/tmp/site-qwen-tts (gpu_tts.py's default --upstream-pythonpath on cuda).
# A fresh machine starts bare and needs the parts again.
set -euo pipefail
PART_MIB="${PART_MIB:-56}"
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qxF '/.gpu-tts/' .git/info/exclude 2>/dev/null || echo '/.gpu-tts/' >> .git/info/exclude
dir=.gpu-tts
mkdir -p "$dir/wheels"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3
      --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
always=(
  transformers==4.57.3 huggingface-hub==0.36.2 tokenizers==0.22.2
  requests==2.34.2 urllib3==2.8.0 idna==3.20 charset-normalizer==3.5.3
  certifi==2026.10.19.post1
  qwen-tts==0.1.1 torchaudio==2.11.1
  librosa==0.11.0 joblib==1.6.0 cloudpickle==3.1.3 decorator==5.3.1 msgpack==1.2.4
  lazy-loader==0.6 audioread==3.1.0 pooch==1.9.0 platformdirs==4.14.9
  einops==0.8.2 sox==1.4.1 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12
)
# distribution name pin : the module the image's python is asked for
if_missing=(scipy==1.17.1:scipy numba==0.68.1:numba llvmlite==0.50.0:numba
            soxr==1.1.0:soxr regex==2026.11.19:regex pyyaml==6.0.4:yaml)
specs=("${always[@]}")
for entry in "${if_missing[@]}"; do specs+=("${entry%%:*}"); done
python3 -m pip download -q --disable-pip-version-check --no-deps "${plat[@]}" \
  -d "$dir/wheels" "${specs[@]}" 2> >(grep -v "^WARNING: Location" >&2)

# which wheel file is which spec: wheel names spell the distribution with "_" for "-" and "."
manifest="$dir/wheels/manifest.txt"
: > "$manifest"
shopt -s nocaseglob nullglob
pick() {  # pick SPEC MODE [MODULE]: its wheel's line in the manifest (MODE always|if_missing)
  local name=${1%%==*} version=${1#*==}
  local found=("$dir/wheels/${name//[-.]/_}-$version-"*.whl)
  if [[ ${#found[@]} -eq 0 ]]; then
    echo "no wheel for $1 in $dir/wheels" >&2
    exit 1
  fi
  echo "$2 ${found[0]##*/} ${3:-}" >> "$manifest"
}
for spec in "${always[@]}"; do pick "$spec" always; done
for entry in "${if_missing[@]}"; do pick "${entry%%:*}" if_missing "${entry#*:}"; done
shopt -u nocaseglob nullglob

# one tar of the wheels the manifest names, split into parts; old parts go first
rm -f "$dir"/part_* "$dir/bundle.tar"
mapfile -t files < <(awk '{print $2}' "$manifest")
# the same wheels make the same bundle (parts carried earlier stay valid when this is rerun)
(cd "$dir/wheels" && tar --sort=name --mtime=2020-01-01 --owner=0 --group=0 --numeric-owner \
  -cf ../bundle.tar manifest.txt "${files[@]}")
sha=$(sha256sum "$dir/bundle.tar" | cut -d' ' -f1)
bytes=$(stat -c %s "$dir/bundle.tar")
split -b "${PART_MIB}M" -d "$dir/bundle.tar" "$dir/part_"
rm "$dir/bundle.tar"
parts=("$dir"/part_*)
last=${parts[${#parts[@]}-1]}

# the installer that runs on the GPU machine (from the project root there)
cat > "$dir/install.sh" <<SH
#!/usr/bin/env bash
# Runs ON the GPU machine (written by bench/stage_qwen_tts_gpu.sh): reassembles the parts in
# \$STAGE (the last one may still be in .gpu-tts/), checks the hash, and installs qwen-tts
# 0.1.1 with transformers 4.57.3 into \$SITE. The image's python is checked, without
# PYTHONPATH, for the compiled modules it may already have.
set -euo pipefail
SHA=$sha
SH
cat >> "$dir/install.sh" <<'SH'
STAGE=${STAGE:-/tmp/stage-tts}
SITE=${SITE:-/tmp/site-qwen-tts}
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$STAGE"
for p in "$here"/part_*; do
  if [[ -e $p ]]; then cp "$p" "$STAGE/"; fi
done
cd "$STAGE"
cat part_* > bundle.tar
echo "$SHA  bundle.tar" | sha256sum -c --quiet - || {
  echo "install.sh: the parts in $STAGE do not make the staged bundle (a part missing?): $(ls part_*)" >&2
  exit 1
}
rm -rf wheels && mkdir wheels && tar -xf bundle.tar -C wheels && rm bundle.tar
wheels=()
while read -r mode file module; do
  if [[ $mode == if_missing ]] && env -u PYTHONPATH "$PY" -c "import $module" 2>/dev/null; then
    echo "install.sh: the image has $module: $(env -u PYTHONPATH "$PY" -c "import $module as m; print(getattr(m, '__version__', '?'))" 2>/dev/null); not installing $file"
    continue
  fi
  wheels+=("wheels/$file")
done < wheels/manifest.txt
rm -rf "$SITE"
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
  --no-cache-dir --target "$SITE" "${wheels[@]}"
# torchaudio's extension must match the image's torch and CUDA; qwen_tts needs none of it
if ! PYTHONPATH=$SITE "$PY" -c 'import torchaudio' 2>/tmp/stage-tts-torchaudio.err; then
  echo "install.sh: torchaudio's libs do not load here ($(tail -1 /tmp/stage-tts-torchaudio.err)); renamed *.so.disabled"
  for so in "$SITE"/torchaudio/lib/*.so; do
    if [[ -e $so ]]; then mv "$so" "$so.disabled"; fi
  done
fi
PYTHONPATH=$SITE HF_HUB_OFFLINE=1 "$PY" - <<'PY'
import importlib.metadata as md

import librosa.filters
import numpy as np
import qwen_tts  # noqa: F401  (imports torchaudio.compliance.kaldi, sox, librosa.filters)
import torch
import transformers

assert transformers.__version__ == "4.57.3", transformers.__version__
mel = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
print(f"install.sh: qwen-tts {md.version('qwen-tts')}, transformers {transformers.__version__}, "
      f"torch {torch.__version__} (cuda {torch.cuda.is_available()}), numpy {np.__version__}, "
      f"librosa {librosa.__version__}, mel {mel.shape}; site {transformers.__file__.rsplit('/', 2)[0]}")
PY
SH
chmod +x "$dir/install.sh"

echo "staged $(wc -l < "$manifest") wheels, $bytes bytes ($(( (bytes + 1048575) / 1048576 )) MiB) in ${#parts[@]} part(s):"
ls -l "${parts[@]}" "$dir/install.sh"
echo
echo "device calls, back to back (the machine stays warm ~30 s between calls):"
for p in "${parts[@]}"; do
  if [[ $p != "$last" ]]; then
    echo "  command: mkdir -p /tmp/stage-tts && cp $p /tmp/stage-tts/    carry: [\"$p\"]"
  fi
done
echo "  command: bash $dir/install.sh    carry: [\"$last\", \"$dir/install.sh\"]"
echo "then: PYTHONPATH=/tmp/site-qwen-tts is what bench/gpu_tts.py gives its upstream worker on cuda"
