#!/usr/bin/env bash
# Profiles `vigil run` during a vigil-bench run: its cold start (from its start until the bench
# says the cold start ended) and its wave (from the first failure for WAVE_SECS seconds), each
# with `perf record`, and writes each profile's top functions (self time) and top callers
# (inclusive time) as text next to the bench's JSON.
#
# Usage: scripts/profile-bench.sh OUT_DIR [vigil-bench arguments…]
#   e.g. scripts/profile-bench.sh /tmp/prof-10k --nodes 10000 --against floor --vigil target/release/vigil
# VIGIL_BENCH_BIN runs another vigil-bench build (pass its vigil with --vigil).
# Needs perf and a release build (cargo build --release -p vigil -p vigil-bench); the profiles
# perturb the run, so its figures are not the benchmark's: take those from runs without it.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/profile-bench.sh OUT_DIR [vigil-bench arguments…]}"
shift
wave_secs="${WAVE_SECS:-40}"
freq="${PERF_FREQ:-199}"
mkdir -p "$out"
: >"$out/bench.err"

"${VIGIL_BENCH_BIN:-target/release/vigil-bench}" "$@" >"$out/bench.json" 2> >(tee -a "$out/bench.err" >&2) &
bench=$!

wait_for() { # a line of the bench's stderr, while the bench runs
  until grep -q "$1" "$out/bench.err"; do
    kill -0 "$bench" 2>/dev/null || { echo "vigil-bench ended before: $1" >&2; exit 1; }
    sleep 0.1
  done
}
vigil_pid() {
  local pid=""
  until [[ -n "$pid" ]]; do pid="$(pgrep -n -f 'vigil[^ ]* run --kubeconfig' || true)"; sleep 0.05; done
  echo "$pid"
}
perf_args=(record -q -F "$freq" --call-graph dwarf,16384)
report() {
  local name=$1
  perf report -i "$out/$name.data" --no-children --sort symbol --percent-limit 0.5 --stdio 2>/dev/null \
    | grep -E '^ +[0-9.]+%' | head -40 >"$out/$name.self.txt" || true
  perf report -i "$out/$name.data" --children --sort symbol --percent-limit 2 --stdio -g none 2>/dev/null \
    | grep -E '^ +[0-9.]+%' | head -60 >"$out/$name.children.txt" || true
}

wait_for "starting vigil"
pid="$(vigil_pid)"
# perf itself in the background (not a function's subshell), so that SIGINT reaches it.
perf "${perf_args[@]}" -p "$pid" -o "$out/cold.data" 2>>"$out/perf.err" &
perf_cold=$!
wait_for "cold start"
kill -INT "$perf_cold" 2>/dev/null || true
wait "$perf_cold" || true

wait_for "failing"
perf "${perf_args[@]}" -p "$pid" -o "$out/wave.data" -- sleep "$wave_secs" 2>>"$out/perf.err" || true

wait "$bench"
report cold
report wave
echo "profiles: $out/cold.self.txt $out/wave.self.txt (and .children.txt); bench: $out/bench.json" >&2
