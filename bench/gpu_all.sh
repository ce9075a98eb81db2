#!/usr/bin/env bash
# The GPU benchmarks in one command, their results in one folder:
#   OUT/gpu_llm.{json,md,log}     bench/gpu_llm.py    (LLM decode, Qwen3-0.6B dimensions)
#   OUT/gpu_omni.{json,md,log}    bench/gpu_omni.py   (Qwen3-Omni text to speech)
#   OUT/gpu_vl_asr.{json,md,log}  bench/gpu_vl_asr.py (Qwen3-VL-2B and Qwen3-ASR-0.6B, c = 1 8 32)
#
#   bench/gpu_all.sh OUT [gpu_omni.py flags...]
#
# GPU_LLM_ARGS and GPU_VL_ASR_ARGS override gpu_llm.py's and gpu_vl_asr.py's flags (default: the
# docs/benchmarks.md runs); PYTHON picks the interpreter. The scripts reuse their --work dirs, so
# a run cut short by a time limit continues where it stopped when started again. Exit status: 0
# when all succeeded, else the first failure's (the later benchmarks run either way).
set -uo pipefail

if [[ $# -lt 1 || $1 == -* ]]; then
    echo "usage: $0 OUT_DIR [gpu_omni.py flags...]" >&2
    exit 2
fi
out=$1
shift
py=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
read -r -a llm_args <<<"${GPU_LLM_ARGS:---batch 1 8 --new-tokens 32 --repeats 2}"
read -r -a vl_asr_args <<<"${GPU_VL_ASR_ARGS:---concurrency 1 8 32}"
mkdir -p "$out"

status=0
run() {
    local name=$1
    shift
    local start=$SECONDS
    echo "== $name: $*"
    "$py" "$here/$name.py" "$@" --out "$out" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    if [[ $rc -ne 0 && $status -eq 0 ]]; then
        status=$rc
    fi
}

run gpu_llm "${llm_args[@]}"
run gpu_omni "$@"
run gpu_vl_asr "${vl_asr_args[@]}"
exit "$status"
