//go:build tools

// The in-memory infrastructure provider is built from its published main package
// (sigs.k8s.io/cluster-api/test/infrastructure/docker); this import keeps it in go.mod/go.sum.
package main

import _ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
