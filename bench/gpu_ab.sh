#!/usr/bin/env bash
# One GPU benchmark on two checkouts in one lease, one after the other: "before" (another
# checkout's root, e.g. `git archive <commit>` unpacked) and "after" (this one), each importing
# edgeomni from its own tree and running its own copy of the script. Leases differ by 2-10%,
# so a change's speed is judged within one (docs/benchmarks.md).
#
#   bench/gpu_ab.sh BASE OUT NAME [flags...]
#   bench/gpu_ab.sh /tmp/base OUT gpu_omni --concurrency 1 4 32 --repeats 1 --skip-transformers
#
# Writes OUT/before/NAME.* and OUT/after/NAME.* (NAME.log: the script's output). Both sides
# share the script's --work dir, so the engines the first builds the second reuses (pass
# --fresh where the script caches measurements). SITE: what goes first on PYTHONPATH
# (default /tmp/site, onnxruntime-gpu as ../shared/gpu/README.md installs it). Exit status:
# the first failure's, else 0.
set -uo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: $0 BASE OUT NAME [flags...]" >&2
    exit 2
fi
base=$(cd "$1" && pwd)
out=$2
name=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
status=0
for side in before after; do
    root=$here
    [[ $side == before ]] && root=$base
    pp=$(mktemp -d)
    ln -s "$root" "$pp/edgeomni"
    mkdir -p "$out/$side"
    start=$SECONDS
    echo "== $side: $name $*"
    (cd "$root" && PYTHONPATH="${SITE:-/tmp/site}:$pp" python "bench/$name.py" "$@" \
        --out "$out/$side") 2>&1 | tee "$out/$side/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $side: exit $rc after $((SECONDS - start)) s"
    if [[ $rc -ne 0 && $status -eq 0 ]]; then
        status=$rc
    fi
done
exit "$status"
