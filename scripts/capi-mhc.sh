#!/usr/bin/env bash
# Build (once, cached) Cluster API's MachineHealthCheck controller harness
# (bench/capi-mhc: a controller-runtime manager with Cluster API's cluster cache and its
# MachineHealthCheck reconciler, sigs.k8s.io/cluster-api pinned in bench/capi-mhc/go.mod),
# using only the Go module proxy. Used by `vigil-bench --against capi`.
#
#   BIN=$(scripts/capi-mhc.sh)   # -> path of the capi-mhc binary
#
# The cache directory is keyed by a hash of go.mod, go.sum and main.go, so any change rebuilds.
# stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

CAPI_VERSION="v1.14.2"   # must match bench/capi-mhc/go.mod

log() { printf '[capi-mhc] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/capi-mhc" && pwd)"
grep -qE "^[[:space:]]*sigs\.k8s\.io/cluster-api ${CAPI_VERSION}\$" "$SRC/go.mod" \
  || die "$SRC/go.mod does not require sigs.k8s.io/cluster-api ${CAPI_VERSION}"
KEY="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/capi-mhc-${CAPI_VERSION}/${KEY}"

is_complete() { [[ -x "$1/capi-mhc" ]] && "$1/capi-mhc" --help >/dev/null 2>&1; }

if is_complete "$OUT"; then
  printf '%s\n' "$OUT/capi-mhc"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# Serialize concurrent invocations.
exec 9>"$PARENT/.lock"
flock 9
if is_complete "$OUT"; then
  printf '%s\n' "$OUT/capi-mhc"
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
log "building sigs.k8s.io/cluster-api ${CAPI_VERSION} MachineHealthCheck harness with $("$GO" version) into $OUT"
(cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/capi-mhc" .) >&2
is_complete "$STAGE" || die "built capi-mhc does not run"
chmod 0755 "$STAGE"
[[ -e "$OUT" ]] && rm -rf "$OUT"
mv -T "$STAGE" "$OUT"
# Older builds (other keys) are not needed any more.
find "$PARENT" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" ! -name '.staging.*' -exec rm -rf {} +
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT/capi-mhc"
