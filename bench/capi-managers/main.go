// Command capi-core runs Cluster API's core reconcilers that own Machines — Cluster,
// Machine, MachineSet and MachineDeployment — and nothing else: no MachineHealthCheck
// reconciler (the stock core manager always runs one, so it could not share a fleet with
// Vigil), no webhooks, no ClusterClass/topology, no MachinePool, no ClusterResourceSet.
// vigil-testenv starts it, together with the published in-memory infrastructure provider
// (sigs.k8s.io/cluster-api/test/infrastructure/docker, built from the same pinned module),
// against its real kube-apiserver so Vigil's marks are acted on by the real MachineSet.
// Options follow the upstream manager's defaults (core/main.go of the pinned version).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
)

// controllerName is the name the upstream core manager uses (user agent, informer names).
const controllerName = "cluster-api-controller-manager"

type options struct {
	kubeconfig                   string
	qps                          float64
	burst                        int
	clusterCacheQPS              float64
	clusterCacheBurst            int
	syncPeriod                   time.Duration
	clusterConcurrency           int
	clusterCacheConcurrency      int
	machineConcurrency           int
	machineSetConcurrency        int
	machineDeploymentConcurrency int
	remoteConnectionGrace        time.Duration
	remoteConditionsGrace        time.Duration
}

func parseFlags() options {
	var o options
	// An own flag set: controller-runtime registers its own --kubeconfig on flag.CommandLine.
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the management cluster (required)")
	// Defaults: the upstream core manager's flags of the same names.
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "client QPS to the management cluster")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "client burst to the management cluster")
	fs.Float64Var(&o.clusterCacheQPS, "clustercache-client-qps", 20, "client QPS of the cluster cache to workload clusters")
	fs.IntVar(&o.clusterCacheBurst, "clustercache-client-burst", 30, "client burst of the cluster cache to workload clusters")
	fs.DurationVar(&o.syncPeriod, "sync-period", 10*time.Minute, "informer resync period")
	fs.IntVar(&o.clusterConcurrency, "cluster-concurrency", 50, "Clusters reconciled at once")
	fs.IntVar(&o.clusterCacheConcurrency, "clustercache-concurrency", 100, "Clusters the cluster cache reconciles at once")
	fs.IntVar(&o.machineConcurrency, "machine-concurrency", 100, "Machines reconciled at once")
	fs.IntVar(&o.machineSetConcurrency, "machineset-concurrency", 50, "MachineSets reconciled at once")
	fs.IntVar(&o.machineDeploymentConcurrency, "machinedeployment-concurrency", 50, "MachineDeployments reconciled at once")
	fs.DurationVar(&o.remoteConnectionGrace, "remote-connection-grace-period", 50*time.Second, "grace before a Cluster's RemoteConnectionProbe goes False")
	fs.DurationVar(&o.remoteConditionsGrace, "remote-conditions-grace-period", 5*time.Minute, "grace before remote Machine conditions go Unknown")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: exits on a bad flag
	return o
}

func main() {
	o := parseFlags()
	ctrl.SetLogger(klog.Background())
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "capi-core: %v\n", err)
		os.Exit(1)
	}
}

func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	// All built-in kinds, as upstream: the cluster cache's client options name DaemonSets,
	// VolumeAttachments and others.
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := clusterv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

func newManager(o options, scheme *runtime.Scheme) (ctrl.Manager, error) {
	if o.kubeconfig == "" {
		return nil, fmt.Errorf("--kubeconfig is required")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %q: %w", o.kubeconfig, err)
	}
	restConfig.QPS = float32(o.qps)
	restConfig.Burst = o.burst
	restConfig.UserAgent = remote.DefaultClusterAPIUserAgent(controllerName)
	// No webhook is registered, so the manager never starts a webhook server.
	return ctrl.NewManager(restConfig, ctrl.Options{
		Scheme: scheme,
		Controller: config.Controller{
			UsePriorityQueue: ptr.To(feature.Gates.Enabled(feature.PriorityQueue)),
			CacheSyncTimeout: 5 * time.Minute,
		},
		LeaderElection:         false,
		HealthProbeBindAddress: "0",
		Metrics:                metricsserver.Options{BindAddress: "0"},
		Cache:                  setup.ManagerCacheOptions(scheme, controllerName, "", o.syncPeriod),
		Client:                 setup.ManagerClientOptions(),
	})
}

func concurrency(n int) controller.Options {
	return controller.Options{MaxConcurrentReconciles: n}
}

func run(o options) error {
	scheme, err := newScheme()
	if err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	mgr, err := newManager(o, scheme)
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return fmt.Errorf("indexes: %w", err)
	}
	clusterCache, err := newClusterCache(ctx, mgr, o)
	if err != nil {
		return fmt.Errorf("cluster cache: %w", err)
	}
	if err := (&cluster.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConnectionGracePeriod: o.remoteConnectionGrace,
	}).SetupWithManager(ctx, mgr, concurrency(o.clusterConcurrency)); err != nil {
		return fmt.Errorf("cluster reconciler: %w", err)
	}
	if err := (&machine.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConditionsGracePeriod: o.remoteConditionsGrace,
	}).SetupWithManager(ctx, mgr, concurrency(o.machineConcurrency)); err != nil {
		return fmt.Errorf("machine reconciler: %w", err)
	}
	if err := (&machineset.Reconciler{
		Client:       mgr.GetClient(),
		APIReader:    mgr.GetAPIReader(),
		ClusterCache: clusterCache,
		// Upstream's default --machineset-preflight-checks=All.
		PreflightChecks: sets.New(clusterv1.MachineSetPreflightCheckAll),
	}).SetupWithManager(ctx, mgr, concurrency(o.machineSetConcurrency)); err != nil {
		return fmt.Errorf("machineset reconciler: %w", err)
	}
	if err := (&machinedeployment.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(ctx, mgr, concurrency(o.machineDeploymentConcurrency)); err != nil {
		return fmt.Errorf("machinedeployment reconciler: %w", err)
	}
	return mgr.Start(ctx)
}

func newClusterCache(ctx context.Context, mgr ctrl.Manager, o options) (clustercache.ClusterCache, error) {
	secretClient, err := setup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	return clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        setup.ClusterCacheCacheOptions(),
		Client:       setup.ClusterCacheClientOptions(controllerName, float32(o.clusterCacheQPS), o.clusterCacheBurst),
	}, concurrency(o.clusterCacheConcurrency))
}
