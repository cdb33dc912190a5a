#!/usr/bin/env bash
# Fetch (once, cached) OpenShift's ClusterVersion and Machine API CRDs from the published Go
# module github.com/openshift/api at a pinned version, using only the Go module proxy.
# Vigil's end-to-end tests install them into their API server: the cluster upgrade pause reads
# `config.openshift.io/v1` ClusterVersions, and remediation objects are owned by the Node's
# `machine.openshift.io/v1beta1` Machine.
#
#   DIR=$(scripts/openshift-crds.sh)   # -> directory holding the CRD YAMLs
#
# stdout: only the directory. Progress/log output goes to stderr.
# The module keeps each API's CRDs under <group dir>/<version>/zz_generated.crd-manifests, one
# file per feature set; the Default set is copied into
# ${XDG_CACHE_HOME:-~/.cache}/vigil/openshift-crds/openshift-api-<version>/ together with the
# module's LICENSE (Apache-2.0), so a later `go clean -modcache` does not lose them.
set -euo pipefail

# ---- pinned version ------------------------------------------------------------
# The version medik8s' NodeHealthCheck operator v0.12.0 builds with (its go.mod).
OPENSHIFT_API_VERSION="v0.0.0-20260227165130-5a7add616a90"   # github.com/openshift/api
# ----------------------------------------------------------------------------------

# module path -> cached file name; the copy counts as complete when all are present.
SOURCES=(
  "config/v1/zz_generated.crd-manifests/0000_00_cluster-version-operator_01_clusterversions-Default.crd.yaml"
  "machine/v1beta1/zz_generated.crd-manifests/0000_10_machine-api_01_machines-Default.crd.yaml"
)
FILES=(
  config.openshift.io_clusterversions.yaml
  machine.openshift.io_machines.yaml
)

log() { printf '[openshift-crds] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/openshift-crds/openshift-api-${OPENSHIFT_API_VERSION}"

is_complete() {
  local dir=$1 f
  [[ -f "$dir/VERSION" ]] && [[ "$(cat "$dir/VERSION")" == "github.com/openshift/api@${OPENSHIFT_API_VERSION}" ]] || return 1
  [[ -s "$dir/LICENSE" ]] || return 1
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

WORK="$(mktemp -d "${TMPDIR:-/tmp}/vigil-openshift-crds.XXXXXX")"
STAGE="$(mktemp -d "$PARENT/.staging.$(basename "$OUT").XXXXXX")"
cleanup() { rm -rf "$WORK" "$STAGE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

log "downloading github.com/openshift/api@${OPENSHIFT_API_VERSION} from the Go module proxy ..."
# Outside any module, so the project's own state plays no part; the Go module cache
# verifies the download against the checksum database.
MOD_DIR="$(cd "$WORK" && GOFLAGS=-mod=mod "$GO" mod download -json "github.com/openshift/api@${OPENSHIFT_API_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n "$MOD_DIR" && -d "$MOD_DIR" ]] || die "github.com/openshift/api@${OPENSHIFT_API_VERSION} is not in the module cache after download"

for i in "${!SOURCES[@]}"; do
  src="$MOD_DIR/${SOURCES[$i]}"
  [[ -s "$src" ]] || die "$src is missing: the module no longer keeps this CRD there"
  cp "$src" "$STAGE/${FILES[$i]}"
done
cp "$MOD_DIR/LICENSE" "$STAGE/LICENSE"
printf 'github.com/openshift/api@%s\n' "$OPENSHIFT_API_VERSION" >"$STAGE/VERSION"
chmod -R u+w,a+rX "$STAGE"
is_complete "$STAGE" || die "copied CRDs failed verification"

if [[ -e "$OUT" ]]; then
  OLD="$(mktemp -d "$PARENT/.old.XXXXXX")"
  mv "$OUT" "$OLD/"
  rm -rf "$OLD"
fi
mv -T "$STAGE" "$OUT"
log "OpenShift API ${OPENSHIFT_API_VERSION} CRDs in $OUT"
printf '%s\n' "$OUT"
