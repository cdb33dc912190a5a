#!/usr/bin/env bash
# Build (once, cached) bench/olm-validate: operator-framework's own bundle loader and
# validators (github.com/operator-framework/api, pinned in bench/olm-validate/go.mod), the
# checks operator-sdk's `bundle validate` runs, using only the Go module proxy. Used by the
# OLM bundle tests (crates/vigil-controller/tests/olm.rs).
#
#   BIN=$(scripts/olm-validate.sh)   # -> path of the olm-validate binary
#   "$BIN" deploy/olm                 # -> JSON findings; exit 1 on any error
#
# Cached as scripts/lib/go-tool.sh says. stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

TOOL=olm-validate
VERSION="v0.45.0"   # must match bench/olm-validate/go.mod
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/olm-validate" && pwd)"
MODULES=(github.com/operator-framework/api)
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

# Without arguments the tool prints its usage and exits 2: it runs.
is_complete() {
  [[ -x "$1/olm-validate" ]] || return 1
  local rc=0
  "$1/olm-validate" >/dev/null 2>&1 || rc=$?
  [[ $rc == 2 ]]
}
build() { (cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$1/olm-validate" .); }

go_tool_main /olm-validate
