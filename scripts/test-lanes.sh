#!/usr/bin/env bash
# Runs every test binary of the workspace as `cargo test --workspace --no-fail-fast` would, but
# two binaries at a time: most integration tests wait on API servers and timeouts, so one binary
# leaves a core idle. Each binary runs in its package's directory, as cargo runs it; its output is
# printed whole when it ends; every binary runs even after one fails, and the failures are named
# at the end. Doc tests run last, through cargo.
#
# Usage: scripts/test-lanes.sh [lanes]   (default 2; VIGIL_TEST_LANES overrides)
set -euo pipefail
cd "$(dirname "$0")/.."

lanes="${1:-${VIGIL_TEST_LANES:-2}}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The longest binaries first, so the lanes end together; a binary not named here runs after them.
longest_first=(twin e2e capi_e2e faults shards medik8s_e2e medik8s_diff standins_e2e short chart
  lease_age failover env around_e2e late_writes live dashboard serve_medik8s floor)

echo "== building every test binary"
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics >"$work/build.json"

# One line per test binary: "<name> <package dir> <executable>".
sed -n '/"profile":{[^}]*"test":true/{
  s/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\2 \1 \3/p
}' "$work/build.json" | sort -u >"$work/all"
[[ -s "$work/all" ]] || { echo "no test binaries found in cargo's build output" >&2; exit 1; }

: >"$work/order"
for name in "${longest_first[@]}"; do
  grep "^$name " "$work/all" >>"$work/order" || true
done
grep -v -F -x -f "$work/order" "$work/all" >>"$work/order" || true
echo "== running $(wc -l <"$work/order") test binaries, $lanes at a time"

run_one() {
  local name="$1" dir="$2" exe="$3" log
  log="$(mktemp "$work/log.XXXXXX")"
  local start=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") >"$log" 2>&1 || rc=$?
  {
    echo "     Running $name (${exe#"$PWD"/}) in $((SECONDS - start)) s, exit $rc"
    cat "$log"
  } | flock "$work/print" cat
  if [[ $rc != 0 ]]; then
    echo "$name (${exe#"$PWD"/}): exit $rc" >>"$work/failed"
  fi
}
export -f run_one
export work

xargs -P "$lanes" -L 1 bash -c 'run_one "$@"' _ <"$work/order"

echo "== doc tests"
if ! cargo test --workspace --locked --doc; then
  echo "doc tests" >>"$work/failed"
fi

if [[ -s "$work/failed" ]]; then
  echo "== FAILED:"
  cat "$work/failed"
  exit 1
fi
echo "== every test binary passed"
