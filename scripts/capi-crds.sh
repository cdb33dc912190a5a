#!/usr/bin/env bash
# Fetch (once, cached) the real Cluster API CRDs from the published Go module
# sigs.k8s.io/cluster-api at a pinned version, using only the Go module proxy.
# Vigil's integration tests install them into their API server.
#
#   DIR=$(scripts/capi-crds.sh)   # -> directory holding cluster.x-k8s.io_*.yaml
#
# stdout: only the directory. Progress/log output goes to stderr.
# The module holds the CRDs under core/config/crd/bases; they are copied into
# ${XDG_CACHE_HOME:-~/.cache}/vigil/capi-crds/cluster-api-<version>/ together with
# the module's LICENSE (Apache-2.0), so a later `go clean -modcache` does not lose them.
set -euo pipefail

# ---- pinned version ------------------------------------------------------------
CAPI_VERSION="v1.14.2"   # sigs.k8s.io/cluster-api
# ----------------------------------------------------------------------------------

# The files the tests need; the copy counts as complete when all are present.
FILES=(
  cluster.x-k8s.io_clusters.yaml
  cluster.x-k8s.io_machines.yaml
  cluster.x-k8s.io_machinesets.yaml
  cluster.x-k8s.io_machinedeployments.yaml
  cluster.x-k8s.io_machinehealthchecks.yaml
)

log() { printf '[capi-crds] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/capi-crds/cluster-api-${CAPI_VERSION}"

is_complete() {
  local dir=$1 f
  [[ -f "$dir/VERSION" ]] && [[ "$(cat "$dir/VERSION")" == "sigs.k8s.io/cluster-api@${CAPI_VERSION}" ]] || return 1
  for f in "${FILES[@]}"; do [[ -s "$dir/$f" ]] || return 1; done
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT"
  exit 0
fi

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"

# Serialize concurrent invocations (several test binaries may start at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$PARENT/.$(basename "$OUT").lock"
  flock 9
  if is_complete "$OUT"; then
    printf '%s\n' "$OUT"
    exit 0
  fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/vigil-capi-crds.XXXXXX")"
STAGE="$(mktemp -d "$PARENT/.staging.$(basename "$OUT").XXXXXX")"
cleanup() { rm -rf "$WORK" "$STAGE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

log "downloading sigs.k8s.io/cluster-api@${CAPI_VERSION} from the Go module proxy ..."
# Outside any module, so the project's own state plays no part; the Go module cache
# verifies the download against the checksum database.
MOD_DIR="$(cd "$WORK" && GOFLAGS=-mod=mod "$GO" mod download -json "sigs.k8s.io/cluster-api@${CAPI_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n "$MOD_DIR" && -d "$MOD_DIR" ]] || die "sigs.k8s.io/cluster-api@${CAPI_VERSION} is not in the module cache after download"
BASES="$MOD_DIR/core/config/crd/bases"
[[ -d "$BASES" ]] || die "$BASES does not exist: the module no longer keeps its CRDs there"

for f in "${FILES[@]}"; do
  [[ -s "$BASES/$f" ]] || die "$BASES/$f is missing"
  cp "$BASES/$f" "$STAGE/$f"
done
cp "$MOD_DIR/LICENSE" "$STAGE/LICENSE"
printf 'sigs.k8s.io/cluster-api@%s\n' "$CAPI_VERSION" >"$STAGE/VERSION"
chmod -R u+w,a+rX "$STAGE"
is_complete "$STAGE" || die "copied CRDs failed verification"

if [[ -e "$OUT" ]]; then
  OLD="$(mktemp -d "$PARENT/.old.XXXXXX")"
  mv "$OUT" "$OLD/"
  rm -rf "$OLD"
fi
mv -T "$STAGE" "$OUT"
log "Cluster API ${CAPI_VERSION} CRDs in $OUT"
printf '%s\n' "$OUT"
