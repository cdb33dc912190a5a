#!/usr/bin/env bash
# Build (once, cached) Cluster API's MachineHealthCheck controller harness
# (bench/capi-mhc: a controller-runtime manager with Cluster API's cluster cache and its
# MachineHealthCheck reconciler, sigs.k8s.io/cluster-api pinned in bench/capi-mhc/go.mod),
# using only the Go module proxy. Used by `vigil-bench --against capi`.
#
#   BIN=$(scripts/capi-mhc.sh)   # -> path of the capi-mhc binary
#
# Cached as scripts/lib/go-tool.sh says. stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

TOOL=capi-mhc
VERSION="v1.14.2"   # must match bench/capi-mhc/go.mod
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/capi-mhc" && pwd)"
MODULES=(sigs.k8s.io/cluster-api)
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

is_complete() { [[ -x "$1/capi-mhc" ]] && "$1/capi-mhc" --help >/dev/null 2>&1; }
build() { (cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$1/capi-mhc" .); }

go_tool_main /capi-mhc
