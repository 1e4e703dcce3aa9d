#!/usr/bin/env bash
# CUDA leg of CI: prove the CUDA half of jitops without a GPU.
#
# In a second virtualenv holding the CUDA build of torch (torch==2.14.1, CUDA
# 13.0), build every builtin library for sm_80 and sm_90 with nvcc, check with
# cuobjdump that each library holds exactly that SASS, load each one in a
# process that sees no GPU and check its ops have CUDA kernels registered;
# the same for one small kernel on torch's stable ABI (tests/data/stable_cuda),
# whose only torch dependency must be the C shim's library; then run the pure
# CUDA tests against torch 2.14.1's own arch parsing.
#
# Skipped (exit 0, with a message saying why) where nvcc is absent or the
# CUDA torch cannot be installed; JITOPS_CUDA_LEG_REQUIRED=1 makes that a
# failure. Time-boxed by JITOPS_CUDA_LEG_TIMEOUT seconds (default 1800).
# `cuda-leg.sh prepare` only makes the venv (where there is an nvcc), for a later run to reuse.
#
# Knobs: JITOPS_CUDA_VENV (default .venv-cuda, reused when it already has the
# CUDA torch), JITOPS_CUDA_ARCHS (default 8.0,9.0), JITOPS_CUDA_LEG_CACHE
# (default: a fresh temporary cache, so the builds are real and timed).
set -euo pipefail
cd "$(dirname "$0")/.."
leg_start=$(date +%s)
budget=${JITOPS_CUDA_LEG_TIMEOUT:-1800}
venv=${JITOPS_CUDA_VENV:-.venv-cuda}
archs=${JITOPS_CUDA_ARCHS:-8.0,9.0}
torch_req="torch==2.14.1"

elapsed() { echo $(( $(date +%s) - leg_start )); }
left() { local l=$(( budget - $(elapsed) )); echo $(( l > 1 ? l : 1 )); }  # never 0: timeout 0 means no limit
skip() {
  echo "cuda-leg: SKIPPED: $*"
  if [ "${JITOPS_CUDA_LEG_REQUIRED:-0}" = 1 ]; then echo "cuda-leg: JITOPS_CUDA_LEG_REQUIRED=1, so this fails"; exit 1; fi
  exit 0
}

# --- nvcc: the search jitops makes (CUDA_HOME alone, else PATH, else /usr/local/cuda; a
# candidate counts only with the CUDA headers in its toolkit, so wrapper scripts are passed over)
nvcc=""
if [ -n "${CUDA_HOME:-}" ]; then candidates=("$CUDA_HOME/bin/nvcc"); else candidates=("$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc); fi
for c in "${candidates[@]}"; do
  [ -n "$c" ] && [ -x "$c" ] || continue
  c=$(realpath "$c")
  if [ -f "$(dirname "$(dirname "$c")")/include/cuda_runtime_api.h" ]; then nvcc=$c; break; fi
done
[ -n "$nvcc" ] || skip "no nvcc inside a CUDA toolkit (tried: ${candidates[*]}). Install the CUDA toolkit and set CUDA_HOME."
echo "cuda-leg: nvcc $nvcc: $("$nvcc" --version | grep -o 'release [0-9.]*' || echo 'version unknown')"

# --- the second venv, with the CUDA build of torch
t=$(date +%s)
py="$venv/bin/python"
has_cuda_torch() { [ -x "$py" ] && "$py" -c "import pytest, torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; }
if has_cuda_torch; then
  echo "cuda-leg: reusing $venv"
else
  python3 -m venv "$venv" || skip "cannot create the virtualenv $venv"
  if ! timeout --kill-after=10 "$(left)" "$venv/bin/pip" install -q "$torch_req" ninja 'filelock>=3.20.3' platformdirs \
      pytest pytest-timeout pytest-xdist numpy > "$venv/pip.log" 2>&1; then
    tail -5 "$venv/pip.log"
    skip "cannot install the CUDA build of torch ($torch_req) into $venv; pip's log: $venv/pip.log"
  fi
  has_cuda_torch || skip "pip installed a torch without CUDA into $venv (torch.version.cuda is None)"
fi
setup_s=$(( $(date +%s) - t ))
"$py" -c "import torch; print(f'cuda-leg: torch {torch.__version__} (CUDA {torch.version.cuda}) in $venv')" 2>/dev/null
# `cuda-leg.sh prepare`: only the venv, made ahead of the leg (.ci/run: while its other set-up runs)
if [ "${1:-}" = prepare ]; then echo "cuda-leg: $venv ready in ${setup_s}s (made ahead of the leg)"; exit 0; fi

# --- cuobjdump: shipped in triton's package beside the CUDA torch, else the toolkit's, else PyPI's
cuobjdump=$(ls "$venv"/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1 || true)
[ -n "$cuobjdump" ] || cuobjdump=$(command -v "$(dirname "$nvcc")/cuobjdump" || command -v cuobjdump || true)
if [ -z "$cuobjdump" ]; then
  "$venv/bin/pip" install -q nvidia-cuda-cuobjdump > /dev/null 2>&1 || true
  cuobjdump=$(find "$venv"/lib/python3*/site-packages/nvidia -name cuobjdump -type f 2>/dev/null | head -1 || true)
fi
[ -n "$cuobjdump" ] || { echo "cuda-leg: FAILED: no cuobjdump (not in triton's package, the toolkit, PATH, or nvidia-cuda-cuobjdump)"; exit 1; }

# --- build, inspect, load (a fresh cache unless one is given)
cache=${JITOPS_CUDA_LEG_CACHE:-}
if [ -z "$cache" ]; then
  cache=$(mktemp -d -t jitops-cuda-leg.XXXXXX)
  trap 'rm -rf "$cache"' EXIT
fi
export JITOPS_CACHE_DIR="$cache" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" JITOPS_PROGRESS=0
unset JITOPS_OFFLINE JITOPS_BUILDER JITOPS_FALLBACK
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}"  # the toolkit found above, for jitops and torch alike
t=$(date +%s)
timeout --kill-after=30 "$(left)" "$py" -W ignore::UserWarning .ci/cuda_leg.py --arch "$archs" --cuobjdump "$cuobjdump" \
  || { rc=$?; [ $rc -ge 124 ] && echo "cuda-leg: FAILED: time box of ${budget}s ran out"; exit $rc; }
checks_s=$(( $(date +%s) - t ))

# --- three real nvcc builds (test_cuda_build.py: odd paths, the lean stand-in, a split bundle), each
# mostly one core waiting on the next step: side by side on three workers (three tests on three
# workers are handed out one apiece); then the pure CUDA tests, against torch 2.14.1's own arch
# parsing, and its ninja writer
t=$(date +%s)
"$py" -c "import xdist" 2> /dev/null || timeout --kill-after=10 "$(left)" "$venv/bin/pip" install -q pytest-xdist > /dev/null 2>&1 || true
workers=(); "$py" -c "import xdist" 2> /dev/null && workers=(-n 3 --dist load)
timeout --kill-after=10 "$(left)" "$py" -m pytest --full -q -p no:cacheprovider "${workers[@]}" tests/test_cuda_build.py
timeout --kill-after=10 "$(left)" "$py" -m pytest --full -q -p no:cacheprovider \
  tests/test_cuda_target.py tests/test_cuda_toolchain.py tests/test_ninja.py
tests_s=$(( $(date +%s) - t ))

echo "cuda-leg: PASSED in $(elapsed)s (venv ${setup_s}s, build + checks ${checks_s}s, pure tests ${tests_s}s)"
