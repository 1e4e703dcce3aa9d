#!/usr/bin/env bash
# torch-versions leg of CI: checks under each extra torch version, each in its own virtualenv
# (.venv-torch-<version>), and the versions test tier (tests/tiers.py) under the newest; one result line per
# check and version, with its time.
#
# The main job tests torch 2.13.0 (CPU), the oldest jitops supports. Extra versions: the CUDA build
# CI already has (2.14.1, reusing the CUDA leg's venv when it exists: it also proves the CPU tiers
# pass with a CUDA torch on a node without a GPU) and the newest (2.15.0).
#
# PyPI has only the large CUDA wheels of 2.15.0; they do not import without their nvidia-*
# libraries (libcudnn.so.9 and friends are loaded at `import torch`), so pip installs them with their
# dependencies: about 1 minute and 4-5 GB per version. This machine's pip configuration caps torch at
# 2.14.1 (/etc/xdg/pip); PIP_CONFIG_FILE=/dev/null makes pip ignore configuration files for these
# installs only, so the newer releases come from PyPI without touching system files.
#
# A stable-ABI CUDA kernel built by the CUDA leg (under its torch, 2.14.1) loads under each other CUDA
# build of torch here with no build and no GPU, when JITOPS_STABLE_CUDA_CACHE names the CUDA leg's cache
# and JITOPS_STABLE_CUDA_HOME the toolkit that leg built with (its path is part of the key: the same
# toolkit through another path, e.g. the /usr/local/cuda link, is another key). .ci/run runs the CUDA leg
# beside this one and passes JITOPS_STABLE_CUDA_READY instead: a file that leg writes when it ends, the
# cache on its first line (empty: nothing was built) and the toolkit on its second; the first check that
# needs them waits for it. The newest version comes first, so its tier runs while the CUDA leg builds.
#
# The versions tier runs under the newest (JITOPS_TORCH_VERSIONS_TIER, default 2.15.0): the main leg has
# the oldest, and 2.14.1 is the CUDA leg's torch, under which that leg builds every builtin op and runs the
# CUDA tests; here 2.14.1 gets the checks below the tier (the stable-ABI entries built under other torches
# load with no build; add rebuilt from the bundle is bit-identical to its torch.add).
#
# Knobs: JITOPS_TORCH_VERSIONS (default "2.15.0 2.14.1"), JITOPS_CUDA_VENV (default .venv-cuda),
# JITOPS_TORCH_VERSIONS_TIMEOUT (default 3600: the whole leg's seconds; a version still running then fails),
# JITOPS_TORCH_VERSIONS_REQUIRED=1 (a version that cannot be installed fails the leg instead of being
# skipped). Exits non-zero if any installed version fails its tests.
set -uo pipefail
cd "$(dirname "$0")/.."
versions=(${JITOPS_TORCH_VERSIONS:-2.15.0 2.14.1})
tier_versions=" ${JITOPS_TORCH_VERSIONS_TIER:-2.15.0} "
cuda_venv=${JITOPS_CUDA_VENV:-.venv-cuda}
deps=(ninja 'filelock>=3.20.3' platformdirs pytest pytest-timeout pytest-xdist hypothesis numpy setuptools 'cryptography>=42')
leg_start=$(date +%s)
budget=${JITOPS_TORCH_VERSIONS_TIMEOUT:-3600}
left() { local l=$(( budget - ($(date +%s) - leg_start) )); echo $(( l > 1 ? l : 1 )); }  # never 0: no limit
failed=0
results=()

# has_torch VENV VERSION [MODULES]: the venv's torch is VERSION and it imports MODULES
has_torch() { [ -x "$1/bin/python" ] && "$1/bin/python" -c "import torch, sys${3:+, $3}; sys.exit(0 if torch.__version__.split('+')[0] == '$2' else 1)" 2>/dev/null; }

# own_venv VERSION: .venv-torch-VERSION with that torch and the test deps, made unless it has them already
own_venv() {
  local venv=".venv-torch-$1"
  has_torch "$venv" "$1" "pytest, hypothesis, cryptography, xdist" && return 0
  python3 -m venv "$venv" && PIP_CONFIG_FILE=/dev/null timeout --kill-after=10 "$(left)" "$venv/bin/pip" install -q \
    "torch==$1" "${deps[@]}" > "$venv/pip.log" 2>&1
}

# `torch-versions.sh prepare`: only make the versions' own venvs (not those in JITOPS_TORCH_VERSIONS_PREPARE_SKIP,
# which another leg makes), so that .ci/run downloads and unpacks them while the CUDA leg compiles
if [ "${1:-}" = prepare ]; then
  for v in "${versions[@]}"; do
    case " ${JITOPS_TORCH_VERSIONS_PREPARE_SKIP:-} " in *" $v "*) continue ;; esac
    t=$(date +%s)
    if own_venv "$v"; then
      echo "torch-versions: .venv-torch-$v ready in $(( $(date +%s) - t ))s (made beside the CUDA leg)"
    else
      echo "torch-versions: could not make .venv-torch-$v beside the CUDA leg; the leg tries again"
    fi
  done
  exit 0
fi

# Issue 33: a stable-ABI kernel built once under the main leg's torch (.venv, 2.13) loads under each version with
# no build (JITOPS_OFFLINE=1: a miss would raise), from the same cache.
stable_cache=$(mktemp -d)
stable_state=$(mktemp -d)
bundle_dir=$(mktemp -d)  # issue 31's bundle, below
trap 'rm -rf "$stable_cache" "$stable_state" "$bundle_dir"' EXIT
stable_load() {  # stable_load PYTHON [ENV...]: the scenario's JSON reply (stdout's last line; stderr to a log)
  env PYTHONPATH="$PWD" JITOPS_CACHE_DIR="$stable_cache" JITOPS_STATE_DIR="$stable_state" "${@:2}" \
    timeout 300 "$1" -m tests.scenario_main scenarios_stable.load_stable '{"name": "ci_scale"}' 2>> "$stable_state/stderr.log" | tail -1
}
stable_loaded() {  # the reply says: loaded without a build, and computed x * 4
  python3 -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if r.get("built") is False and r.get("out") == [4.0, 4.0, 4.0] else 1)' "$1" 2>/dev/null
}
stable_main=$(stable_load "${JITOPS_MAIN_PYTHON:-.venv/bin/python}")

# Issue 31: a bundle of add and nms built under the main leg's torch (no signing key: unsigned) and pip-installed
# into a folder. Under each other version add's entry is another torch's: skipped (`jitops explain add` names
# torch_version), add built here and bit-identical to torch.add, nothing mapped from the bundle. nms's CPU build is
# on torch's stable ABI (its key holds the ABI's target version, not torch's): with builds forbidden
# (jitops.freeze()) it loads from the bundle, never built, its indices those of the Python reference.
main_py=${JITOPS_MAIN_PYTHON:-.venv/bin/python}
env PYTHONPATH="$PWD" JITOPS_CACHE_DIR="$stable_cache" JITOPS_STATE_DIR="$stable_state" JITOPS_CONFIG_DIR="$bundle_dir/no-key" \
    JITOPS_PROGRESS=0 timeout --kill-after=10 "$(left)" "$main_py" -m jitops bundle build --ops add,nms --out "$bundle_dir/dist" \
    --name ci --version 1 \
    > "$bundle_dir/build.log" 2>&1 \
  && timeout --kill-after=10 "$(left)" "$main_py" -m pip install -q --no-deps --no-index --target "$bundle_dir/site" "$bundle_dir"/dist/*.whl \
    >> "$bundle_dir/build.log" 2>&1
bundle_built=$?
bundle_get() {  # bundle_get PYTHON VERSION: scenarios_bundles.other_torch's JSON reply (stderr to a log)
  env PYTHONPATH="$PWD:$bundle_dir/site" JITOPS_CACHE_DIR="$bundle_dir/cache-$2" JITOPS_STATE_DIR="$stable_state" \
    JITOPS_CONFIG_DIR="$bundle_dir/no-key" JITOPS_PROGRESS=0 timeout --kill-after=10 "$(left)" "$1" -m tests.scenario_main \
    scenarios_bundles.other_torch "$(python3 -c 'import json, sys; print(json.dumps({"bundle_root": sys.argv[1]}))' \
    "$bundle_dir/site/jitops_bundle_ci")" 2>> "$bundle_dir/stderr.log" | tail -1
}
bundle_rebuilt() {  # the reply says: add's entry differs in torch_version, add built here, bit-identical; nms from it
  python3 -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if "error" not in r and r["built"] is True
and r["mapped_from_bundle"] == [] and r["bit_identical"] == [True, True, True] and "torch_version" in r["before"]["diffs"]
and "/jitops_bundle_ci/" in r["before"]["nearest"] and "error" not in r["nms"] and r["nms"]["built"] is False
and all(r["nms"]["same_as_reference"]) and len(r["nms"]["same_as_reference"]) == 5
and any(p.endswith("/libnms.so") for p in r["nms"]["mapped_from_bundle"])
and not [a for a in r["nms"]["spawned"] if any(w in ("-c", "-shared", "-o") or w.endswith("ninja") for w in a[1:])]
else 1)' "$1" 2>/dev/null
}

cuda_leg_ended() {  # JITOPS_STABLE_CUDA_READY: wait for the CUDA leg beside this one, then take its cache and toolkit
  local ready=${JITOPS_STABLE_CUDA_READY:-}
  [ -n "$ready" ] || return 0
  local t=$(date +%s)
  while [ ! -e "$ready" ] && [ "$(left)" -gt 1 ]; do sleep 2; done
  [ -e "$ready" ] || return 1
  JITOPS_STABLE_CUDA_CACHE=$(sed -n 1p "$ready") JITOPS_STABLE_CUDA_HOME=$(sed -n 2p "$ready") JITOPS_STABLE_CUDA_READY=""
  echo "torch-versions: waited $(( $(date +%s) - t ))s for the CUDA leg beside this one"
}

for v in "${versions[@]}"; do
  t=$(date +%s)
  venv=".venv-torch-$v"
  if has_torch "$cuda_venv" "$v" pytest; then  # the CUDA leg's venv: add the compile tier's test deps
    venv=$cuda_venv
    has_torch "$venv" "$v" "pytest, hypothesis, setuptools, cryptography, xdist" \
      || timeout --kill-after=10 "$(left)" "$venv/bin/pip" install -q hypothesis setuptools 'cryptography>=42' pytest-xdist > /dev/null 2>&1
  elif ! own_venv "$v"; then
    tail -3 "$venv/pip.log"
    results+=("torch $v: SKIPPED: pip could not install it (log: $venv/pip.log)")
    [ "${JITOPS_TORCH_VERSIONS_REQUIRED:-0}" = 1 ] && failed=1
    continue
  fi
  setup_s=$(( $(date +%s) - t ))
  t=$(date +%s)
  log="$venv/pytest.log"
  # A fresh session cache per version (conftest makes one); the default jobs; no GPU tests. The versions tier
  # (tests/tiers.py): the fast tier (one real build of each builtin op, a smoke test of each entry point), every
  # pure test, and the builtin ops' parity tests against this torch (no build beyond the fast tier's). User-kernel
  # builds (the drop-in, PCHs, compilers) do not depend on torch's version beyond what the fast tier builds; the
  # compile tier here took ~13 min a version (CI of 2026-11-26), this tier ~5. The adversarial suite (cache,
  # store and archive logic) and the drop-in's header-parity probes (against the main leg's torch headers) run in
  # the main leg only: this leg's venvs have no remote-tier extras but `cryptography` (jitops[remote]: signed
  # bundles and archives, whose tests are in the pure tier).
  tier_ran=0
  if [[ "$tier_versions" == *" $v "* ]]; then
    tier_ran=1
    PYTHONPATH="$PWD" JITOPS_PROGRESS=0 timeout --kill-after=10 "$(left)" "$venv/bin/python" -m pytest --tier versions -q \
        -n 2 --dist loadfile -p no:cacheprovider --ignore=tests/adversarial --ignore=tests/test_dropin_parity.py > "$log" 2>&1
    rc=$?
    summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$log" | tail -1 | tr -d '=' | xargs)
  else
    rc=0
  fi
  tests_s=$(( $(date +%s) - t ))
  reply=$(stable_load "$venv/bin/python" JITOPS_OFFLINE=1)
  if stable_loaded "$reply"; then
    results+=("torch $v: stable-ABI entry built under the main torch loaded with no build")
  else
    failed=1; results+=("torch $v: FAILED: the stable-ABI entry built under the main torch ($stable_main) did not load: $reply $(tail -3 "$stable_state/stderr.log")")
  fi
  if ! cuda_leg_ended; then
    failed=1; results+=("torch $v: FAILED: the CUDA leg wrote no $JITOPS_STABLE_CUDA_READY before this leg's time box ran out")
  fi
  stable_cuda=${JITOPS_STABLE_CUDA_CACHE:-}
  if [ -n "$stable_cuda" ] && [ -d "$stable_cuda" ] \
      && "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2> /dev/null; then
    cuda_log="$stable_state/stable-cuda-$v.log"
    if env PYTHONPATH="$PWD" JITOPS_CACHE_DIR="$stable_cuda" JITOPS_STATE_DIR="$stable_state" JITOPS_PROGRESS=0 \
        CUDA_HOME="${JITOPS_STABLE_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}" timeout --kill-after=10 "$(left)" "$venv/bin/python" -W ignore::UserWarning \
        .ci/cuda_leg.py --load-stable --arch "${JITOPS_CUDA_ARCHS:-8.0,9.0}" > "$cuda_log" 2>&1; then
      results+=("torch $v: the stable-ABI CUDA kernel built under the CUDA leg's torch loaded with no build, CUDA kernel registered (no GPU)")
    else
      failed=1; results+=("torch $v: FAILED: the stable-ABI CUDA kernel built under the CUDA leg's torch: $(tail -3 "$cuda_log")")
    fi
  fi
  if [ $bundle_built -ne 0 ]; then
    failed=1; results+=("torch $v: FAILED: no bundle of add and nms was built under the main torch: $(tail -3 "$bundle_dir/build.log")")
  else
    reply=$(bundle_get "$venv/bin/python" "$v")
    if bundle_rebuilt "$reply"; then
      results+=("torch $v: the main torch's bundle: add skipped (another torch_version), built here, bit-identical; nms (stable ABI) loaded from it frozen, same indices")
    else
      failed=1; results+=("torch $v: FAILED: the main torch's bundle of add and nms: $reply $(tail -3 "$bundle_dir/stderr.log")")
    fi
  fi
  if [ $tier_ran -eq 0 ]; then
    results+=("torch $v: the versions tier runs under${tier_versions% } only (JITOPS_TORCH_VERSIONS_TIER), venv ${setup_s}s [$venv]")
  elif [ $rc -eq 0 ]; then
    results+=("torch $v: PASSED ($summary) in ${tests_s}s, venv ${setup_s}s [$venv]")
  else
    failed=1
    grep -E "^(FAILED|ERROR) " "$log" | head -10
    results+=("torch $v: FAILED ($summary) in ${tests_s}s, venv ${setup_s}s; log: $log")
  fi
done

for line in "${results[@]}"; do echo "torch-versions: $line"; done
echo "torch-versions: leg finished in $(( $(date +%s) - leg_start ))s"
exit $failed
