#!/usr/bin/env bash
# Issue 27's checks in one prepared run on a GPU node (GPU time comes in one short loan), every output teed
# into $OUT (or a fresh temporary folder):
#   1. the builtin ops' CUDA libraries built for this GPU (`jitops warm --device cuda`), timed, with their sizes;
#   2. the cuda-marked tests against that cache (a stable-ABI CUDA kernel among them) and, beside them, the CUDA edit loop
#      (benchmarks/cuda_edit_loop.py: it compiles on a few of the node's cores while the tests use the GPU;
#      cuda-edit-loop-gpu.json for docs/gen_bench.py);
#   3. benchmarks/kernels.py --device cuda: the per-call cost of a small op, nms against torchvision, then
#      softmax/log_softmax against torch eager and torch.compile (alone on the node: nothing else runs while it
#      times), its figures and conditions in $OUT/kernels-gpu.json for docs/gen_bench.py (keep that file, with
#      env.txt and kernels.txt, in benchmarks/results/<date>-gpu/ beside a README.md naming the machine).
# Each phase is time-boxed inside GPU_SESSION_SECONDS (default 540). Knobs: GPU_SESSION_PER_OP=0 (one warm for
# all three ops), GPU_SESSION_LOOP (edit-loop loaders, 0: none), GPU_SESSION_TESTS / _WORKERS / _DIST / _TEST_SECONDS,
# GPU_SESSION_KERNELS=0 (skip phase 3). First run (H100, 2026-11-27): builds 34 + 19 + 79 s, the cuda tests
# 112 s on 12 workers, kernels 190 s. Wheels the node lacks (platformdirs, expecttest) travel in .whl/
# (DEVELOPERS.md: the GPU machine).
# Usage there: bash benchmarks/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
unset CXX  # the node's CXX is a wrapper whose extensions crash on their first C++ error
out=${OUT:-$(mktemp -d)}
start=$(date +%s)
budget=${GPU_SESSION_SECONDS:-540}
left() { local l=$(( budget - ($(date +%s) - start) )); echo $(( l > 5 ? l : 5 )); }
upto() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # the phase's own cap, or what is left
site=/tmp/jitops-site
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::UserWarning
export JITOPS_CACHE_DIR=/tmp/jitops-gpu-cache JITOPS_STATE_DIR=/tmp/jitops-gpu-state TORCHINDUCTOR_CACHE_DIR=/tmp/jitops-gpu-inductor
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "cores: $(nproc); TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-unset}"
  python3 -c "import torch, triton, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'torchvision', torchvision.__version__)"
  nvcc --version | tail -2
} 2>&1 | tee "$out/env.txt"

echo "== 1. build"
if [ "${GPU_SESSION_PER_OP:-1}" = 1 ]; then  # one op after another, each timed: the first build a user waits for
  for op in softmax nms add; do
    t=$(date +%s.%N)
    timeout "$(upto 240)" python3 -m jitops warm "$op" --device cuda >> "$out/build.txt" 2>&1
    echo "build $op rc=$?: $(python3 -c "import time; print(f'{time.time() - $t:.1f}')") s" | tee -a "$out/build.txt"
  done
else  # all three in one warm: the shortest wall time
  timeout "$(upto 240)" python3 -m jitops warm softmax nms add --device cuda >> "$out/build.txt" 2>&1
fi
tail -20 "$out/build.txt"
find "$JITOPS_CACHE_DIR" -name '*.so' -printf '%s bytes  %p\n' | tee -a "$out/build.txt"

echo "== 2. cuda tests, and the CUDA edit loop beside them"
loop=
# the fastest layouts first: a time limit cuts the slowest; the result file keeps each finished loader
loaders=${GPU_SESSION_LOOP:-stable-split,jitops-split,stable,torch-split,jitops,torch}
if [ "$loaders" != 0 ]; then
  timeout "$(upto 240)" python3 benchmarks/cuda_edit_loop.py --only "$loaders" --child-timeout 150 \
    --out "$out/cuda-edit-loop-gpu.json" --conditions "beside the cuda tests (gpu_session.sh phase 2)" \
    > "$out/edit_loop.txt" 2>&1 &
  loop=$!
fi
# SIGINT at the time limit: pytest then still prints its summary (which tests failed, and why) for what ran
# shellcheck disable=SC2086
JITOPS_TEST_CACHE_DIR=$JITOPS_CACHE_DIR timeout -s INT -k 15 "$(upto "${GPU_SESSION_TEST_SECONDS:-180}")" \
  python3 -m pytest -m cuda -q -n "${GPU_SESSION_WORKERS:-12}" --dist "${GPU_SESSION_DIST:-load}" -p no:cacheprovider -o addopts="" -rf \
  --tb=line ${GPU_SESSION_TESTS:-tests/test_cuda_ops.py tests/test_bench.py tests/test_parity_softmax.py tests/test_parity_add_nms.py tests/test_nms_parity.py tests/test_stable_cuda.py} \
  2>&1 | tee "$out/tests.txt" | tail -150
echo "tests rc=${PIPESTATUS[0]}"
if [ -n "$loop" ]; then
  wait "$loop"
  echo "edit loop rc=$?"
  cat "$out/edit_loop.txt"
fi

[ "${GPU_SESSION_KERNELS:-1}" = 1 ] || exit 0
echo "== 3. kernels (left: $(left) s)"
# kernels-gpu.json: the figures with the device and the run's conditions, which docs/gen_bench.py
# renders as docs/benchmarks/kernels-gpu.md once it is kept under benchmarks/results/<folder>/; SIGINT
# at the time limit still writes the cases measured so far
timeout -s INT -k 15 "$(left)" python3 benchmarks/kernels.py --device cuda --out "$out/kernels-gpu.json" \
  --conditions "alone on the node (gpu_session.sh phase 3)" 2>&1 | tee "$out/kernels.txt"
echo "kernels rc=${PIPESTATUS[0]}; whole run $(( $(date +%s) - start )) s"
