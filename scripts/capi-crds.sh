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
# the module's LICENSE (Apache-2.0) (scripts/lib/go-module-files.sh).
set -euo pipefail

# ---- pinned version ------------------------------------------------------------
VERSION="v1.14.2"   # sigs.k8s.io/cluster-api
# ----------------------------------------------------------------------------------

TOOL=capi-crds
MODULE=sigs.k8s.io/cluster-api
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/capi-crds/cluster-api-${VERSION}"
# The files the tests need.
PAIRS=()
for f in cluster.x-k8s.io_clusters.yaml cluster.x-k8s.io_machines.yaml cluster.x-k8s.io_machinesets.yaml \
  cluster.x-k8s.io_machinedeployments.yaml cluster.x-k8s.io_machinehealthchecks.yaml; do
  PAIRS+=("core/config/crd/bases/$f=$f")
done

source "$(dirname "${BASH_SOURCE[0]}")/lib/go-module-files.sh"
go_module_files_main
