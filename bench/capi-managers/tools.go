//go:build tools

// The in-memory infrastructure provider, the KubeadmControlPlane manager and the kubeadm
// bootstrap manager are built from their published main packages
// (sigs.k8s.io/cluster-api/test/infrastructure/docker, sigs.k8s.io/cluster-api/controlplane/kubeadm,
// sigs.k8s.io/cluster-api/bootstrap/kubeadm); these imports keep them in go.mod/go.sum.
package main

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
)
