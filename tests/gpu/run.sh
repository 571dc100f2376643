#!/usr/bin/env bash
# Benchmark collc's CuPy executors on this machine's GPUs.
#
#   tests/gpu/run.sh [RESULTS.md] [gpu_benchmark.py options...]
#
# Generates executors for AllGather, ReduceScatter, AllReduce, AllToAll and Broadcast on
# 8 ranks, runs them with --device gpu --check over a size sweep (one process; also one
# process per GPU over NCCL when there are 8 GPUs), measures a device-to-device copy
# reference in the same run, and writes a markdown report (default
# bench/results/gpu-<device>.md). Options after the file go to tests/gpu/gpu_benchmark.py,
# e.g. --sizes "-b 1M -e 64M -f 4" --ranks 4.
#
# PYTHON names the interpreter (default python3); it needs collc (pip install -e .) and,
# for GPUs, CuPy. Exits 0 with a message where there is no GPU or no CuPy; 1 if a run
# fails its check.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

output=()
if [[ $# -gt 0 && "$1" != -* ]]; then
    output=(--output "$1")
    shift
fi

device=gpu
for arg in "$@"; do
    if [[ "$arg" == "--device=cpu" ]]; then device=cpu; fi
done
for ((i = 1; i < $#; i++)); do
    if [[ "${!i}" == "--device" ]]; then
        next=$((i + 1))
        device="${!next}"
    fi
done

if [[ "$device" == gpu ]]; then
    if ! reason="$("$python" - 2>&1 <<'EOF'
import sys
try:
    import cupy
except ImportError:
    sys.exit("CuPy is not installed")
try:
    count = cupy.cuda.runtime.getDeviceCount()
except Exception as exc:
    sys.exit(f"CuPy finds no CUDA device ({exc})")
if count < 1:
    sys.exit("CuPy finds no CUDA device")
EOF
)"; then
        echo "tests/gpu/run.sh: skipped: ${reason:-no GPU}"
        exit 0
    fi
fi

# collc is needed here only to generate the executors (they run without it).
# From outside the checkout: there, ./collc would hide an installed (non-editable) collc.
if ! (cd / && "$python" -c "import collc.backends.cupy.generate") >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: $python cannot import collc: pip install -e $repo (or set PYTHON)" >&2
    exit 1
fi

exec "$python" "$here/gpu_benchmark.py" ${output[@]+"${output[@]}"} "$@"
