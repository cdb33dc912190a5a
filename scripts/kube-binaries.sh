#!/usr/bin/env bash
# Build (once, cached) the real `kube-apiserver` and `etcd` binaries from the
# published Go modules, using only the Go module proxy (no GitHub / release
# downloads). Used by Vigil's integration tests that run etcd + kube-apiserver
# on loopback.
#
#   BIN=$(scripts/kube-binaries.sh)   # -> directory containing both binaries
#
# stdout: only the output directory. Progress/log output goes to stderr.
# See scripts/README-kube-binaries.md for versions, timings and test flags.
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------
K8S_VERSION="v1.34.4"   # k8s.io/kubernetes (staging modules: v0.34.4)
ETCD_VERSION="v3.6.16"  # go.etcd.io/etcd/server/v3
# -----------------------------------------------------------------------------

log() { printf '[kube-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

OUT="${VIGIL_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vigil/kube-bin/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}}"

# Both binaries present and runnable (and the apiserver reports the pinned version)?
is_complete() {
  local dir=$1
  [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]] || return 1
  "$dir/etcd" --version >/dev/null 2>&1 || return 1
  "$dir/kube-apiserver" --version 2>/dev/null | grep -qF "$K8S_VERSION" || return 1
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"

# Serialize concurrent invocations (e.g. several test binaries starting at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$PARENT/.$(basename "$OUT").lock"
  log "acquiring build lock $PARENT/.$(basename "$OUT").lock ..."
  flock 9
  if is_complete "$OUT"; then
    printf '%s\n' "$OUT"
    exit 0
  fi
  # We hold the lock: leftovers of an interrupted earlier build can go.
  rm -rf "$PARENT/.staging.$(basename "$OUT")."*
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/vigil-kube-build.XXXXXX")"
# Staging dir next to $OUT so the final rename is atomic (same filesystem).
STAGE="$(mktemp -d "$PARENT/.staging.$(basename "$OUT").XXXXXX")"
cleanup() { rm -rf "$WORK" "$STAGE"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"
# Use the default GOMODCACHE / GOCACHE so rebuilds are fast.

start=$SECONDS
log "go: $("$GO" version)"
log "building kube-apiserver ${K8S_VERSION} and etcd ${ETCD_VERSION} into $OUT"

# ---- kube-apiserver ----------------------------------------------------------
{
  log "downloading k8s.io/kubernetes@${K8S_VERSION} ..."
  K8S_DIR="$(cd "$WORK" && "$GO" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  K8S_INFO="$(cd "$WORK" && "$GO" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
    | sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$K8S_DIR/go.mod" ]] || die "k8s.io/kubernetes@${K8S_VERSION} not in module cache"

  STAGING_VERSION="v0.${K8S_VERSION#v1.}"   # v1.34.4 -> v0.34.4
  K8S_GO_LINE="$(grep -m1 -E '^go [0-9]' "$K8S_DIR/go.mod")"
  K8S_GODEBUG="$(grep -E '^godebug ' "$K8S_DIR/go.mod" || true)"
  # Every `k8s.io/xxx => ./staging/src/k8s.io/xxx` becomes `k8s.io/xxx => k8s.io/xxx v0.N.M`.
  REPLACES="$(grep -E '^[[:space:]]*k8s\.io/[^[:space:]]+[[:space:]]+=>[[:space:]]+\./staging/src/' "$K8S_DIR/go.mod" \
    | awk -v v="$STAGING_VERSION" '{ printf "\t%s => %s %s\n", $1, $1, v }')"
  [[ -n "$REPLACES" ]] || die "found no staging replace directives in $K8S_DIR/go.mod"

  mkdir -p "$WORK/apiserver"
  cat >"$WORK/apiserver/go.mod" <<EOF
module vigil.local/kube-binaries/apiserver

${K8S_GO_LINE}

${K8S_GODEBUG}

require k8s.io/kubernetes ${K8S_VERSION}

replace (
${REPLACES}
)
EOF

  # Version stamping as in hack/lib/version.sh, so --version and GET /version
  # report e.g. v1.34.4 instead of v0.0.0-master.
  BUILD_DATE="1970-01-01T00:00:00Z"
  if [[ -f "$K8S_INFO" ]]; then
    BUILD_DATE="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$K8S_INFO")"
  fi
  MAJOR="${K8S_VERSION#v}"; MAJOR="${MAJOR%%.*}"
  MINOR="${K8S_VERSION#v*.}"; MINOR="${MINOR%%.*}"
  LDFLAGS="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS+=" -X '${pkg}.gitVersion=${K8S_VERSION}'"
    LDFLAGS+=" -X '${pkg}.gitMajor=${MAJOR}'"
    LDFLAGS+=" -X '${pkg}.gitMinor=${MINOR}'"
    LDFLAGS+=" -X '${pkg}.gitCommit='"
    LDFLAGS+=" -X '${pkg}.gitTreeState=clean'"
    LDFLAGS+=" -X '${pkg}.buildDate=${BUILD_DATE}'"
  done

  log "compiling kube-apiserver (first build takes a long time) ..."
  t0=$SECONDS
  (cd "$WORK/apiserver" && "$GO" build -trimpath -ldflags "$LDFLAGS" \
      -o "$STAGE/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
  log "kube-apiserver built in $((SECONDS - t0))s"
} >&2

# ---- etcd --------------------------------------------------------------------
{
  mkdir -p "$WORK/etcd"
  ETCD_GO_LINE="$(cd "$WORK" && "$GO" mod download -json "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' | xargs grep -m1 -E '^go [0-9]')"
  cat >"$WORK/etcd/go.mod" <<EOF
module vigil.local/kube-binaries/etcd

${ETCD_GO_LINE}

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
EOF
  log "compiling etcd ..."
  t0=$SECONDS
  # go.etcd.io/etcd/server/v3 (module root) is etcd's `package main`.
  (cd "$WORK/etcd" && "$GO" build -trimpath \
      -ldflags "-s -w -X 'go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}'" \
      -o "$STAGE/etcd" go.etcd.io/etcd/server/v3)
  log "etcd built in $((SECONDS - t0))s"
} >&2

# ---- verify and install atomically --------------------------------------------
"$STAGE/etcd" --version >&2 || die "built etcd does not run"
"$STAGE/kube-apiserver" --version >&2 || die "built kube-apiserver does not run"
is_complete "$STAGE" || die "built binaries failed verification"
chmod 0755 "$STAGE"

if [[ -e "$OUT" ]]; then
  OLD="$(mktemp -d "$PARENT/.old.XXXXXX")"
  mv "$OUT" "$OLD/"
  rm -rf "$OLD"
fi
mv -T "$STAGE" "$OUT"
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT"
