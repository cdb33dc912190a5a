#!/usr/bin/env bash
# Build (once, cached) the `helm` CLI from its published Go module, using only the
# Go module proxy (no release downloads). Used by the chart tests (deploy/helm/vigil).
#
#   HELM=$(scripts/helm.sh)   # -> path of the helm binary
#
# stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

HELM_VERSION="v3.22.0"   # helm.sh/helm/v3

log() { printf '[helm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

OUT="${VIGIL_HELM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vigil/helm-${HELM_VERSION}}"

is_complete() {
  [[ -x "$1/helm" ]] && "$1/helm" version --template '{{.Version}}' 2>/dev/null | grep -qxF "$HELM_VERSION"
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT/helm"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# Serialize concurrent invocations.
exec 9>"$PARENT/.$(basename "$OUT").lock"
flock 9
if is_complete "$OUT"; then
  printf '%s\n' "$OUT/helm"
  exit 0
fi
rm -rf "$PARENT/.staging.$(basename "$OUT")."*

STAGE="$(mktemp -d "$PARENT/.staging.$(basename "$OUT").XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
trap 'exit 130' INT TERM HUP

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
start=$SECONDS
log "building helm ${HELM_VERSION} with $("$GO" version) into $OUT"
# Version stamping as helm's Makefile does, so `helm version` reports the pinned version
# (charts' kubeVersion checks and the cache check above read it).
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
GOBIN="$STAGE" "$GO" install -trimpath -ldflags "$LDFLAGS" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
"$STAGE/helm" version >&2 || die "built helm does not run"
is_complete "$STAGE" || die "built helm does not report ${HELM_VERSION}"
chmod 0755 "$STAGE"
[[ -e "$OUT" ]] && rm -rf "$OUT"
mv -T "$STAGE" "$OUT"
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT/helm"
