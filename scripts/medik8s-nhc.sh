#!/usr/bin/env bash
# Build (once, cached) the medik8s NodeHealthCheck operator's manager, the reference of the
# differential test and the contender of `vigil-bench --against medik8s`: its published main
# (github.com/medik8s/node-healthcheck-operator/cmd, pinned in bench/medik8s-nhc/go.mod),
# fetched only from the Go module proxy.
#   nhc-manager  the operator's manager as shipped (flags and environment: vigil-testenv's
#                medik8s module, crates/vigil-testenv/src/medik8s.rs)
#   remediation.medik8s.io_nodehealthchecks.yaml
#                its CRD as the module publishes it (the project installs its committed copy,
#                crates/vigil-testenv/upstream-crds/medik8s; a test compares the two)
#   LICENSE      the operator's licence (Apache-2.0), VERSION its module version
#
#   DIR=$(scripts/medik8s-nhc.sh)   # -> directory holding nhc-manager
#
# Cached as scripts/lib/go-tool.sh says. stdout: only the directory. Progress goes to stderr.
set -euo pipefail

TOOL=medik8s-nhc
VERSION="v0.12.0"   # must match bench/medik8s-nhc/go.mod
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/medik8s-nhc" && pwd)"
MODULES=(github.com/medik8s/node-healthcheck-operator)
CRD=remediation.medik8s.io_nodehealthchecks.yaml
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

# The manager's flag set answers --help with exit 0.
is_complete() {
  [[ -x "$1/nhc-manager" && -s "$1/LICENSE" && -s "$1/$CRD" ]] && "$1/nhc-manager" --help >/dev/null 2>&1
}

build() {
  local stage="$1" dir
  (cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$stage/nhc-manager" github.com/medik8s/node-healthcheck-operator/cmd)
  dir="$(cd "$SRC" && "$GO" list -m -f '{{.Dir}}' github.com/medik8s/node-healthcheck-operator)"
  [[ -s "$dir/config/crd/bases/$CRD" ]] || die "$dir/config/crd/bases/$CRD does not exist: the module no longer keeps its CRD there"
  cp "$dir/config/crd/bases/$CRD" "$stage/$CRD"
  cp "$dir/LICENSE" "$stage/LICENSE"
  printf 'github.com/medik8s/node-healthcheck-operator@%s\n' "$VERSION" >"$stage/VERSION"
}

go_tool_main ""
