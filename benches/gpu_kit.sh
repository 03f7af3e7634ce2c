#!/usr/bin/env bash
# The real-GPU checks and benchmarks from prebuilt binaries, for a GPU
# machine that has torch but no Rust toolchain and no network.
#
#   bash benches/gpu_kit.sh build          # where Rust is: fills target/gpu-kit
#   bash benches/gpu_kit.sh tests          # on the GPU machine, from the repository root:
#                                          #   every device and CLI test (a rank's staging
#                                          #   too), the ignored ones included
#   bash benches/gpu_kit.sh python         # the Python package's tests there, the GPU ones included
#   bash benches/gpu_kit.sh bench [ARGS]   # compare ARGS, then python-load
#   bash benches/gpu_kit.sh compare [ARGS] # benches/gpu_compare.py --bins target/gpu-kit ARGS
#   bash benches/gpu_kit.sh python-load [ARGS]  # benches/python_load.py --cuda ARGS
#   bash benches/gpu_kit.sh prepare [ARGS] # gpu_compare.py --prepare ARGS: the checkpoints only
#   bash benches/gpu_kit.sh disk [FILE]    # the disk's cold read limit on FILE (default: the
#                                          #   prepared 2 GB checkpoint): pread, pread with
#                                          #   read-ahead advice, direct I/O; 16 in flight
#   bash benches/gpu_kit.sh all [ARGS]     # tests, python, compare ARGS, python-load, each
#                                          #   under a timeout (the checkpoints written
#                                          #   meanwhile); $OUT/summary.txt at the end
#
# `build` makes x86-64 release binaries: the CLI, the device and CLI test
# binaries, the gpu_load bench, and the Python package's abi3 wheel; it
# records the repository path they were built in (the tests find the
# fixtures and the CLI there). The other steps, where that path does not
# exist, link it to this checkout. Logs go to $OUT when it is set (`all`
# sets it to target/gpu-kit-out when it is not).
#
# `all` takes at most 8.5 minutes: each step is stopped at its limit
# (ALL_LIMITS below; a stopped step is reported as such and the next one
# starts), the checkpoints are written while the tests run, and
# gpu_compare starts no new measurement after --budget-s, so that its
# last one ends before its limit. docs/benchmarks.md says how the limits
# and run counts were estimated.
set -euo pipefail
script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$script")/.."
target=${CARGO_TARGET_DIR:-target}
kit=target/gpu-kit
log() { if [ -n "${OUT:-}" ]; then tee -a "$OUT/gpu_kit-$1.log"; else cat; fi; }

# The executable of target $1 a cargo build step made, from its JSON messages.
executable() {
  python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m.get("executable")
        and m["target"]["name"] == sys.argv[1] and m["profile"]["test"]]
if len(exes) != 1:
    sys.exit(f"{sys.argv[1]}: {len(exes)} executables built")
print(exes[0])' "$1"
}

build() {
  rm -rf "$kit"
  mkdir -p "$kit"
  cargo build --release --locked -p ptload-cli
  cp "$target/release/ptload" "$kit/ptload"
  local exe
  exe=$(cargo test --release --locked --no-run -p ptload-device --test device \
    --message-format=json | executable device)
  cp "$exe" "$kit/device-tests"
  exe=$(cargo test --release --locked --no-run -p ptload-device --test rank_staging \
    --message-format=json | executable rank_staging)
  cp "$exe" "$kit/rank-staging-tests"
  exe=$(cargo test --release --locked --no-run -p ptload-cli --test cli \
    --message-format=json | executable cli)
  cp "$exe" "$kit/cli-tests"
  exe=$(cargo bench --locked --no-run -p ptload-device --bench gpu_load \
    --message-format=json | executable gpu_load)
  cp "$exe" "$kit/gpu_load"
  exe=$(cargo bench --locked --no-run -p ptload-device --bench staging_fill \
    --message-format=json | executable staging_fill)
  cp "$exe" "$kit/staging_fill"
  strip "$kit"/ptload "$kit"/device-tests "$kit"/rank-staging-tests "$kit"/cli-tests \
    "$kit"/gpu_load "$kit"/staging_fill
  local maturin=${MATURIN:-maturin}
  "$maturin" build --release --locked --strip -m bindings/python/Cargo.toml -o "$kit"
  # The tests read fixtures and run the CLI by their build-time paths.
  echo "$PWD" >"$kit/root"
  git describe --always --dirty >"$kit/commit" 2>/dev/null || echo unknown >"$kit/commit"
  (cd "$target" && pwd) >"$kit/target"
  # The binaries need this glibc or newer where they run.
  ldd --version | head -n 1 >"$kit/glibc"
  du -sh "$kit"
  ls -l "$kit"
}

# Where `build` ran, reachable from here: the test binaries read fixtures
# and run the CLI by their build-time paths.
reach_build_root() {
  [ -f "$kit/root" ] || { echo "no $kit/root: run 'bash benches/gpu_kit.sh build' first" >&2; exit 2; }
  local root built
  root=$(cat "$kit/root")
  built=$(cat "$kit/target")
  if [ "$root" != "$PWD" ]; then
    if [ -e "$root" ]; then
      # Another checkout there: the tests would read its fixtures.
      [ "$(cd "$root" && pwd -P)" = "$(pwd -P)" ] || {
        echo "$root exists and is not this checkout: the kit's tests would read it" >&2
        exit 2
      }
    else
      mkdir -p "$(dirname "$root")"
      ln -s "$PWD" "$root"
    fi
  fi
  # The CLI the tests run, from the kit (never a stale local build).
  mkdir -p "$built/release"
  cp "$kit/ptload" "$built/release/ptload"
}

tests() {
  reach_build_root
  { nvidia-smi -L || true; } 2>&1 | log tests
  # Every suite runs whatever the others give; the step fails if any did.
  # One device test at a time: they share the GPU and check its memory.
  local failed=0
  "$kit/device-tests" --include-ignored --test-threads 1 2>&1 | log tests || failed=1
  "$kit/rank-staging-tests" --include-ignored 2>&1 | log tests || failed=1
  "$kit/cli-tests" --include-ignored 2>&1 | log tests || failed=1
  return "$failed"
}

python_tests() {
  reach_build_root
  local site=/tmp/ptload-site
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --target "$site" "$kit"/ptload-*.whl
  # A GPU machine has what its image ships, and no registry: a library the
  # drop-in tests run under that is not installed there is deselected, and
  # said so in the log (CI installs every one and runs them all).
  local lib words missing=()
  for lib in transformers:from_pretrained pytorch_lightning:lightning diffusers:diffusers; do
    words=${lib#*:}
    lib=${lib%%:*}
    if ! python3 -c "import $lib" >/dev/null 2>&1; then
      echo "deselected: tests named *$words* (they run under $lib, not installed on this machine)" |
        log "${LOG_AS:-python}"
      missing+=("not $words")
    fi
  done
  local deselect=()
  if [ ${#missing[@]} -gt 0 ]; then
    local expr
    expr=$(printf ' and %s' "${missing[@]}")
    deselect=(-k "${expr# and }")
  fi
  (cd bindings/python && PYTHONPATH="$site" python3 -m pytest -q -rs "${deselect[@]}" tests) 2>&1 | log "${LOG_AS:-python}"
}

compare() {
  reach_build_root
  PYTHONUNBUFFERED=1 python3 benches/gpu_compare.py --bins "$kit" "$@" 2>&1 | log "${LOG_AS:-bench}"
}

# gpu_compare --prepare: the checkpoints only. It runs the kit's CLI,
# never the copy the tests run (replacing that one under a running test
# would fail), so it needs no reach_build_root and runs beside the tests.
prepare() {
  PYTHONUNBUFFERED=1 python3 benches/gpu_compare.py --bins "$kit" --prepare "$@" 2>&1 | log prepare
}

# The disk's cold read limit on the file cold loads are judged on: 16
# workers taking 32 MiB runs in order, the page cache emptied before each
# run, by positioned reads, with the runs ahead announced (madvise
# WILLNEED), and by direct I/O (O_DIRECT, no page cache); the fastest is
# the limit.
disk() {
  local file=${1:-/tmp/ptload-gpu-bench/transformer-2gb.pt}
  echo "disk read limit of $file (cold, 16 in flight):" | log "${LOG_AS:-disk}"
  "$kit/staging_fill" "$file" 2 16 cold 2>&1 | log "${LOG_AS:-disk}"
}

python_load() {
  reach_build_root
  local site=/tmp/ptload-site
  [ -d "$site" ] || python3 -m pip install -q --no-index --no-deps --target "$site" "$kit"/ptload-*.whl
  PYTHONUNBUFFERED=1 PYTHONPATH="$site" python3 benches/python_load.py --cuda "$@" 2>&1 | log "${LOG_AS:-bench}"
}

bench() {
  compare "$@"
  python_load
}

# Seconds each step of `all` may take, and the measurements gpu_compare
# makes there (docs/benchmarks.md, "the kit, and the one-step run"). `prepare`
# writes the checkpoints while the tests run.
ALL_LIMITS=(tests=90 python=90 prepare=180 compare=260 disk=25 python-load=45)
ALL_COMPARE=(--sizes 2,8 --runs 2 --cold-runs 1 --tp-runs 3 --sweep-runs 2 --budget-s 210)
ALL_PYTHON_LOAD=(--runs 5)

limit_of() {
  printf '%s\n' "${ALL_LIMITS[@]}" | sed -n "s/^$1=//p"
}

# One line to $steps on how step $1 of `all` ended: exit status $2, after
# $3 seconds.
report_step() {
  local name=$1 rc=$2 result
  case $rc in
    0) result=pass ;;
    124 | 137) result="STOPPED at its limit of $(limit_of "$name") s" ;;
    *) result="FAIL (exit status $rc)" ;;
  esac
  printf '%-12s %s, %d s\n' "$name" "$result" "$3" | tee -a "$steps"
  [ "$rc" = 0 ] || failed=1
}

# Run step $1 of `all` (this script with the other arguments) under its
# limit.
step() {
  local name=$1 rc=0 start=$SECONDS
  shift
  echo "== $name (stopped after $(limit_of "$name") s)"
  LOG_AS=$name timeout -k 10 "$(limit_of "$name")" bash "$script" "$@" || rc=$?
  report_step "$name" "$rc" $((SECONDS - start))
}

all() {
  export OUT=${OUT:-$PWD/target/gpu-kit-out}
  mkdir -p "$OUT"
  local steps=$OUT/steps.txt report=$OUT/gpu_compare-report.md failed=0
  rm -f "$steps" "$report"
  # The checkpoints are written beside the tests (CPU and disk; nothing is
  # timed meanwhile); its output is in gpu_kit-prepare.log.
  local prepare_start=$SECONDS prepare_rc=0 prepare_pid
  timeout -k 10 "$(limit_of prepare)" bash "$script" prepare "${ALL_COMPARE[@]}" "$@" </dev/null >/dev/null 2>&1 &
  prepare_pid=$!
  step tests tests
  step python python
  wait "$prepare_pid" || prepare_rc=$?
  report_step prepare "$prepare_rc" $((SECONDS - prepare_start))
  step compare compare "${ALL_COMPARE[@]}" --report "$report" "$@"
  step disk disk
  step python-load python-load "${ALL_PYTHON_LOAD[@]}"
  {
    echo "bash benches/gpu_kit.sh all: $(date -u '+%Y-%m-%d %H:%M UTC'), ptload $(cat "$kit/commit" 2>/dev/null || echo unknown) (built)"
    { nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"; } | head -n 4
    echo
    cat "$steps"
    echo
    if [ -f "$report" ]; then
      cat "$report"
    else
      echo "gpu_compare: no report (see gpu_kit-compare.log)"
    fi
    echo
    echo "the disk, cold (gpu_kit-disk.log; the fastest is the limit cold loads are judged against):"
    grep ' workers: ' "$OUT/gpu_kit-disk.log" 2>/dev/null || echo "  no figures (see gpu_kit-disk.log)"
    echo
    echo "python_load.py --cuda (gpu_kit-python-load.log):"
    python3 - "$OUT/gpu_kit-python-load.log" 2>&1 <<'PY' || true
import json, sys
try:
    text = open(sys.argv[1]).read()
    doc = json.loads(text[text.index("\n{") + 1:] if not text.startswith("{") else text)
except (OSError, ValueError) as e:
    sys.exit(f"  no results ({e.__class__.__name__}: the step's log says why)")
for name, row in doc["results"].items():
    ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row.items() if k.startswith("vs "))
    print(f"  {name}: ptload.torch.load {ratios}")
PY
  } >"$OUT/summary.txt"
  cat "$OUT/summary.txt"
  return "$failed"
}

case "${1:-}" in
  build) build ;;
  tests) tests ;;
  python) python_tests ;;
  bench) shift; bench "$@" ;;
  compare) shift; compare "$@" ;;
  python-load) shift; python_load "$@" ;;
  prepare) shift; prepare "$@" ;;
  disk) shift; disk "$@" ;;
  all) shift; all "$@" ;;
  *)
    sed -n '2,/^[^#]/{/^#/p}' "$script" >&2
    exit 2
    ;;
esac
