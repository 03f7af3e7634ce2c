#!/usr/bin/env bash
# Run fuzz targets for a while each: fuzz/run.sh SECONDS [TARGET...]
# FUZZ_SEED=N fixes libFuzzer's random seed and FUZZ_RUNS=N stops each
# target after N inputs (still within SECONDS): with both, and a fresh
# corpus, a run is repeatable (CI's smoke run uses them).
# Needs a nightly toolchain and cargo-fuzz. Each target starts from its
# seeds (the fixtures, the hostile corpus, fuzz/seeds/TARGET) and keeps
# what it learns in fuzz/corpus/TARGET (not committed). A crash stops the
# script with libFuzzer's report; the input is saved under
# fuzz/artifacts/TARGET: fix the bug, then copy the input to
# fuzz/regressions/TARGET so cargo test replays it.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pickle_vm container checkpoint map_location differential structured output_paths dcp)
cargo +nightly fuzz build -O >/dev/null
bin_dir=target/$(rustc +nightly -vV | sed -n "s/^host: //p")/release
# Each target runs on a small stack (the binary is started directly, so the
# limit applies to the fuzzed code, not to cargo): any recursion over input
# data overflows it long before 100,000 levels. libFuzzer's -timeout stops
# any input that takes over FUZZ_TIMEOUT seconds, so superlinear work shows
# up as a finding, not as a slow run.
stack_kb=${FUZZ_STACK_KB:-1024}
timeout_s=${FUZZ_TIMEOUT:-10}
for t in "${targets[@]}"; do
  seeds=()
  case $t in
    checkpoint|container) seeds=(../fixtures/files ../tests/hostile) ;;
    pickle_vm) seeds=(seeds/pickle_vm seeds/differential) ;;
    differential|map_location|dcp) seeds=(seeds/$t) ;;
  esac
  [ -d "regressions/$t" ] && seeds+=("regressions/$t")
  extra=()
  [ "$t" = differential ] && extra+=(-max_len=4096)
  [ -n "${FUZZ_SEED:-}" ] && extra+=(-seed="$FUZZ_SEED")
  [ -n "${FUZZ_RUNS:-}" ] && extra+=(-runs="$FUZZ_RUNS")
  [ -n "${FUZZ_CORPUS:-}" ] && corpus="$FUZZ_CORPUS/$t" || corpus="corpus/$t"
  echo "== $t: ${seconds}s"
  log=$(mktemp)
  rc=0
  mkdir -p "$corpus" "artifacts/$t"
  (ulimit -s "$stack_kb" && exec "$bin_dir/$t" "$corpus" "${seeds[@]}" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout="$timeout_s" "${extra[@]}" \
    -artifact_prefix="artifacts/$t/" -print_final_stats=1) >"$log" 2>&1 || rc=$?
  grep -E "^(stat::|SUMMARY|Done|INFO: seed corpus)|panicked|ERROR|Test unit|crash-|timeout-|oom-" "$log" || true
  if [ $rc -ne 0 ]; then
    grep -A3 panicked "$log" || tail -30 "$log"
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
done
