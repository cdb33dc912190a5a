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
# module's LICENSE (Apache-2.0) (scripts/lib/go-module-files.sh).
set -euo pipefail

# ---- pinned version ------------------------------------------------------------
# The version medik8s' NodeHealthCheck operator v0.12.0 builds with (its go.mod).
VERSION="v0.0.0-20260227165130-5a7add616a90"   # github.com/openshift/api
# ----------------------------------------------------------------------------------

TOOL=openshift-crds
MODULE=github.com/openshift/api
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/openshift-crds/openshift-api-${VERSION}"
PAIRS=(
  "config/v1/zz_generated.crd-manifests/0000_00_cluster-version-operator_01_clusterversions-Default.crd.yaml=config.openshift.io_clusterversions.yaml"
  "machine/v1beta1/zz_generated.crd-manifests/0000_10_machine-api_01_machines-Default.crd.yaml=machine.openshift.io_machines.yaml"
)

source "$(dirname "${BASH_SOURCE[0]}")/lib/go-module-files.sh"
go_module_files_main
