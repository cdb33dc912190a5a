#!/usr/bin/env bash
# Build (once, cached) the real Cluster API controllers that the Cluster API end-to-end tests
# and `vigil-bench --clusters` run against Vigil, pinned in bench/capi-managers/go.mod and
# fetched only from the Go module proxy:
#   capi-core   our main (bench/capi-managers/main.go): Cluster API's Cluster, Machine,
#               MachineSet and MachineDeployment reconcilers, without its MachineHealthCheck
#   capi-infra  the published in-memory infrastructure provider
#               (sigs.k8s.io/cluster-api/test/infrastructure/docker: DevCluster/DevMachine)
#   capi-kcp    the published KubeadmControlPlane manager (sigs.k8s.io/cluster-api/controlplane/kubeadm)
#   capi-cabpk  the published kubeadm bootstrap manager (sigs.k8s.io/cluster-api/bootstrap/kubeadm)
#   crds/       Cluster API's core CRDs (cluster.x-k8s.io), that provider's CRDs
#               (infrastructure.cluster.x-k8s.io) and the kubeadm control-plane and bootstrap
#               CRDs (controlplane. / bootstrap.cluster.x-k8s.io), from the same modules, as published
#
#   DIR=$(scripts/capi-managers.sh)   # -> directory holding capi-core, capi-infra, capi-kcp, capi-cabpk, crds/
#
# The cache directory is keyed by a hash of go.mod, go.sum and the Go sources, so any change
# rebuilds. stdout: only the directory. Progress goes to stderr.
set -euo pipefail

CAPI_VERSION="v1.14.2"   # must match bench/capi-managers/go.mod

log() { printf '[capi-managers] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/capi-managers" && pwd)"
for m in sigs.k8s.io/cluster-api sigs.k8s.io/cluster-api/test; do
  grep -qE "^[[:space:]]*${m//./\\.} ${CAPI_VERSION}\$" "$SRC/go.mod" \
    || die "$SRC/go.mod does not require $m ${CAPI_VERSION}"
done
KEY="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -c1-16)"
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/capi-managers-${CAPI_VERSION}/${KEY}"

is_complete() {
  [[ -x "$1/capi-core" && -x "$1/capi-infra" && -x "$1/capi-kcp" && -x "$1/capi-cabpk" \
    && -s "$1/crds/infrastructure.cluster.x-k8s.io_devmachines.yaml" \
    && -s "$1/crds/cluster.x-k8s.io_machinedeployments.yaml" \
    && -s "$1/crds/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml" \
    && -s "$1/crds/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml" ]] \
    && "$1/capi-core" --help >/dev/null 2>&1
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# Serialize concurrent invocations.
exec 9>"$PARENT/.lock"
flock 9
if is_complete "$OUT"; then
  printf '%s\n' "$OUT"
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
log "building sigs.k8s.io/cluster-api ${CAPI_VERSION} core reconcilers, in-memory provider, kubeadm control plane and bootstrap with $("$GO" version) into $OUT"
(
  cd "$SRC"
  "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/capi-core" .
  "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/capi-infra" sigs.k8s.io/cluster-api/test/infrastructure/docker
  "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/capi-kcp" sigs.k8s.io/cluster-api/controlplane/kubeadm
  "$GO" build -trimpath -ldflags "-s -w" -o "$STAGE/capi-cabpk" sigs.k8s.io/cluster-api/bootstrap/kubeadm
) >&2
CORE_DIR="$(cd "$SRC" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
TEST_DIR="$(cd "$SRC" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)"
mkdir "$STAGE/crds"
for bases in "$CORE_DIR/core/config/crd/bases" "$TEST_DIR/infrastructure/docker/config/crd/bases" \
  "$CORE_DIR/controlplane/kubeadm/config/crd/bases" "$CORE_DIR/bootstrap/kubeadm/config/crd/bases"; do
  [[ -d "$bases" ]] || die "$bases does not exist: the modules no longer keep their CRDs there"
done
cp "$CORE_DIR"/core/config/crd/bases/cluster.x-k8s.io_*.yaml "$STAGE/crds/"
cp "$TEST_DIR"/infrastructure/docker/config/crd/bases/infrastructure.cluster.x-k8s.io_*.yaml "$STAGE/crds/"
cp "$CORE_DIR"/controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_*.yaml "$STAGE/crds/"
cp "$CORE_DIR"/bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_*.yaml "$STAGE/crds/"
cp "$CORE_DIR/LICENSE" "$STAGE/LICENSE"
printf 'sigs.k8s.io/cluster-api@%s\n' "$CAPI_VERSION" >"$STAGE/VERSION"
chmod -R u+w,a+rX "$STAGE"
is_complete "$STAGE" || die "built capi-core does not run"
[[ -e "$OUT" ]] && rm -rf "$OUT"
mv -T "$STAGE" "$OUT"
# Older builds (other keys) are not needed any more.
find "$PARENT" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" ! -name '.staging.*' -exec rm -rf {} +
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT"
