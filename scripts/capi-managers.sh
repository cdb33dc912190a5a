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
# Cached as scripts/lib/go-tool.sh says. stdout: only the directory. Progress goes to stderr.
set -euo pipefail

TOOL=capi-managers
VERSION="v1.14.2"   # must match bench/capi-managers/go.mod
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/capi-managers" && pwd)"
MODULES=(sigs.k8s.io/cluster-api sigs.k8s.io/cluster-api/test)
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

is_complete() {
  [[ -x "$1/capi-core" && -x "$1/capi-infra" && -x "$1/capi-kcp" && -x "$1/capi-cabpk" \
    && -s "$1/crds/infrastructure.cluster.x-k8s.io_devmachines.yaml" \
    && -s "$1/crds/cluster.x-k8s.io_machinedeployments.yaml" \
    && -s "$1/crds/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml" \
    && -s "$1/crds/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml" ]] \
    && "$1/capi-core" --help >/dev/null 2>&1
}

# The core reconcilers (our main), the in-memory provider, the kubeadm control plane and
# bootstrap (stock mains), and the CRDs of all four from the same modules.
build() {
  local stage="$1"
  (
    cd "$SRC"
    "$GO" build -trimpath -ldflags "-s -w" -o "$stage/capi-core" .
    "$GO" build -trimpath -ldflags "-s -w" -o "$stage/capi-infra" sigs.k8s.io/cluster-api/test/infrastructure/docker
    "$GO" build -trimpath -ldflags "-s -w" -o "$stage/capi-kcp" sigs.k8s.io/cluster-api/controlplane/kubeadm
    "$GO" build -trimpath -ldflags "-s -w" -o "$stage/capi-cabpk" sigs.k8s.io/cluster-api/bootstrap/kubeadm
  )
  local core_dir test_dir bases
  core_dir="$(cd "$SRC" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
  test_dir="$(cd "$SRC" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)"
  mkdir "$stage/crds"
  for bases in "$core_dir/core/config/crd/bases" "$test_dir/infrastructure/docker/config/crd/bases" \
    "$core_dir/controlplane/kubeadm/config/crd/bases" "$core_dir/bootstrap/kubeadm/config/crd/bases"; do
    [[ -d "$bases" ]] || die "$bases does not exist: the modules no longer keep their CRDs there"
  done
  cp "$core_dir"/core/config/crd/bases/cluster.x-k8s.io_*.yaml "$stage/crds/"
  cp "$test_dir"/infrastructure/docker/config/crd/bases/infrastructure.cluster.x-k8s.io_*.yaml "$stage/crds/"
  cp "$core_dir"/controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_*.yaml "$stage/crds/"
  cp "$core_dir"/bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_*.yaml "$stage/crds/"
  cp "$core_dir/LICENSE" "$stage/LICENSE"
  printf 'sigs.k8s.io/cluster-api@%s\n' "$VERSION" >"$stage/VERSION"
}

go_tool_main ""
