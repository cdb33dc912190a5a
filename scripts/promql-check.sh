#!/usr/bin/env bash
# Build (once, cached) bench/promql-check: Prometheus' own PromQL parser and rule-file checker
# (github.com/prometheus/prometheus, pinned in bench/promql-check/go.mod) reading the chart's
# Grafana dashboard and rule files, using only the Go module proxy. Used by the chart test that
# compares the metrics they name with what a live `vigil run` serves.
#
#   BIN=$(scripts/promql-check.sh)   # -> path of the promql-check binary
#   "$BIN" deploy/helm/vigil/dashboards/vigil.json deploy/helm/vigil/rules/*.yaml deploy/helm/vigil/alerts/*.yaml
#
# Cached as scripts/lib/go-tool.sh says. stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

TOOL=promql-check
VERSION="v0.316.0"   # must match bench/promql-check/go.mod
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bench/promql-check" && pwd)"
MODULES=(github.com/prometheus/prometheus)
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

# Without arguments the tool prints its usage and exits 2: it runs.
is_complete() {
  [[ -x "$1/promql-check" ]] || return 1
  local rc=0
  "$1/promql-check" >/dev/null 2>&1 || rc=$?
  [[ $rc == 2 ]]
}
build() { (cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$1/promql-check" .); }

go_tool_main /promql-check
