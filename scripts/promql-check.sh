#!/usr/bin/env bash
# Build (once, cached) bench/promql-check: Prometheus' own PromQL parser and rule-file checker
# (github.com/prometheus/prometheus, pinned in bench/promql-check/go.mod) reading the chart's
# Grafana dashboard and rule files, using only the Go module proxy. Used by the chart test that
# compares the metrics they name with what a live `vigil run` serves.
#
#   BIN=$(scripts/promql-check.sh)   # -> path of the promql-check binary
#   "$BIN" deploy/helm/vigil/dashboards/vigil.json deploy/helm/vigil/rules/*.yaml deploy/helm/vigil/alerts/*.yaml
#
# The cache directory is keyed by a hash of go.mod, go.sum and main.go, so any change rebuilds.
# stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

PROMETHEUS_VERSION="v0.316.0"   # must match bench/promql-check/go.mod

log() { printf '[promql-check] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/promql-check" && pwd)"
grep -qE "^[[:space:]]*github\.com/prometheus/prometheus ${PROMETHEUS_VERSION}\$" "$SRC/go.mod" \
  || die "$SRC/go.mod does not require github.com/prometheus/prometheus ${PROMETHEUS_VERSION}"
KEY="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/promql-check-${PROMETHEUS_VERSION}/${KEY}"

# Without arguments the tool prints its usage and exits 2: it runs.
is_complete() {
  [[ -x "$1/promql-check" ]] || return 1
  local rc=0
  "$1/promql-check" >/dev/null 2>&1 || rc=$?
  [[ $rc == 2 ]]
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT/promql-check"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# Serialize concurrent invocations.
exec 9>"$PARENT/.lock"
flock 9
if is_complete "$OUT"; then
  printf '%s\n' "$OUT/promql-check"
  exit 0
fi
rm -rf "$PARENT/.staging."*

STAGE="$(mktemp -d "$PARENT/.staging.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
trap 'exit 130' INT TERM HUP

export CGO_ENABLED=0
# go.sum is committed: -mod=readonly makes a stale go.mod/go.sum an error instead of a silent edit.
export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"
start=$SECONDS
log "building promql-check (github.com/prometheus/prometheus ${PROMETHEUS_VERSION}) with $("$GO" version) into $OUT"
(cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/promql-check" .) >&2
is_complete "$STAGE" || die "built promql-check does not run"
chmod 0755 "$STAGE"
[[ -e "$OUT" ]] && rm -rf "$OUT"
mv -T "$STAGE" "$OUT"
# Older builds (other keys) are not needed any more.
find "$PARENT" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" ! -name '.staging.*' -exec rm -rf {} +
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT/promql-check"
