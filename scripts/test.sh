#!/usr/bin/env bash
# The whole test suite, from a fresh clone: formatting, lints, every test of the workspace.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== the simulator alone, as the README's first command builds it (no cluster commands)"
cargo clippy -p vigil --no-default-features --bins --locked -- -D warnings

echo "== kube-apiserver + etcd for integration tests (built once, cached)"
# One build up front, rather than by many tests at once; vigil-testenv reads the variable.
VIGIL_KUBE_BIN_DIR="$(scripts/kube-binaries.sh)"
export VIGIL_KUBE_BIN_DIR

echo "== Cluster API CRDs for integration tests (sigs.k8s.io/cluster-api module, cached)"
VIGIL_CAPI_CRD_DIR="$(scripts/capi-crds.sh)"
export VIGIL_CAPI_CRD_DIR

echo "== OpenShift ClusterVersion and Machine CRDs for integration tests (github.com/openshift/api module, cached)"
# The upgrade pause and the Machine owner of remediation objects (crates/vigil-controller/tests/standins_e2e.rs);
# vigil-testenv reads the variable.
VIGIL_OPENSHIFT_CRD_DIR="$(scripts/openshift-crds.sh)"
export VIGIL_OPENSHIFT_CRD_DIR

echo "== Cluster API's own controllers for the real-Cluster-API tests (sigs.k8s.io/cluster-api v1.14.2, built once, cached)"
# Core reconcilers without its MachineHealthCheck, and the in-memory infrastructure provider
# (crates/vigil-controller/tests/capi_e2e.rs); vigil-testenv reads the variable.
VIGIL_CAPI_MANAGERS_DIR="$(scripts/capi-managers.sh)"
export VIGIL_CAPI_MANAGERS_DIR

echo "== medik8s' NodeHealthCheck operator for the differential test and its start-up test (v0.12.0, built once, cached)"
# Its published manager, run by vigil-testenv's medik8s module; vigil-testenv reads the variable.
VIGIL_MEDIK8S_NHC_DIR="$(scripts/medik8s-nhc.sh)"
export VIGIL_MEDIK8S_NHC_DIR

echo "== helm for the chart tests (built once, cached)"
VIGIL_HELM="$(scripts/helm.sh)"
export VIGIL_HELM

echo "== olm-validate for the OLM bundle test (operator-framework/api's validators, built once, cached)"
# Loads deploy/olm as OLM does and runs the default, OperatorHub and good-practices validators
# (crates/vigil-controller/tests/olm.rs reads the variable).
VIGIL_OLM_VALIDATE="$(scripts/olm-validate.sh)"
export VIGIL_OLM_VALIDATE

echo "== promql-check for the dashboard test (Prometheus' own PromQL parser, built once, cached)"
# Parses the chart's dashboard and rule files; the chart test compares the metrics they name
# with a live controller's /metrics (crates/vigil-controller/tests/chart.rs reads the variable).
VIGIL_PROMQL_CHECK="$(scripts/promql-check.sh)"
export VIGIL_PROMQL_CHECK

echo "== the book under docs/ (mdBook from crates.io, installed once, cached)"
# The link check (crates/vigil/tests/book.rs) builds it again and reads the variable.
VIGIL_MDBOOK="$(scripts/mdbook.sh)"
export VIGIL_MDBOOK
"$VIGIL_MDBOOK" build docs

echo "== podman and the Vigil image for the image test (installed and built once, cached)"
# podman.sh exits 3 only when apt-get cannot install podman: the image test then says it skipped.
if podman_env="$(scripts/podman.sh)"; then
  eval "$podman_env"
  VIGIL_IMAGE="$(scripts/image.sh)"
  export VIGIL_IMAGE
else
  rc=$?
  [[ $rc == 3 ]] || exit "$rc"
  echo "!!!! podman cannot be installed here: the image test will report that it skipped !!!!"
fi

echo "== cargo test, two test binaries at a time"
# What `cargo test --workspace --locked --no-fail-fast` runs, two binaries at a time: every binary
# runs even after one fails, so a red run names every failure at once.
scripts/test-lanes.sh
