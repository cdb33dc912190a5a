#!/usr/bin/env bash
# The whole test suite, from a fresh clone: formatting, lints, every test of the workspace.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== kube-apiserver + etcd for integration tests (built once, cached)"
# One build up front, rather than by many tests at once; vigil-testenv reads the variable.
VIGIL_KUBE_BIN_DIR="$(scripts/kube-binaries.sh)"
export VIGIL_KUBE_BIN_DIR

echo "== helm for the chart tests (built once, cached)"
VIGIL_HELM="$(scripts/helm.sh)"
export VIGIL_HELM

echo "== cargo test"
cargo test --workspace --locked
