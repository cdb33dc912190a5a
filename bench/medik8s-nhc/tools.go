//go:build tools

// The NodeHealthCheck operator's manager is built from its published main package
// (github.com/medik8s/node-healthcheck-operator/cmd, pinned in go.mod); this import keeps it
// in go.mod and go.sum. The replace in go.mod pins k8s.io/kube-aggregator to a version the
// Go module proxy serves (the operator's graph asks for v0.34.7, which it refuses).
package main

import (
	_ "github.com/medik8s/node-healthcheck-operator/cmd"
)
