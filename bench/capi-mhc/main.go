// Command capi-mhc runs Cluster API's MachineHealthCheck reconciler and nothing else:
// a controller-runtime manager with Cluster API's scheme, its ClusterCache and the exported
// MachineHealthCheck reconciler of sigs.k8s.io/cluster-api (version pinned in go.mod).
// vigil-bench (`--against capi`) starts it against the same API server and fleet as Vigil,
// so both are measured the same way. Options follow the upstream manager's defaults
// (core/main.go of the pinned version) unless a flag says otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
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
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/util/index"
)

// controllerName is the name the upstream core manager uses (user agent, informer names).
const controllerName = "cluster-api-controller-manager"

type options struct {
	kubeconfig              string
	mhcConcurrency          int
	clusterCacheConcurrency int
	qps                     float64
	burst                   int
	clusterCacheQPS         float64
	clusterCacheBurst       int
	syncPeriod              time.Duration
}

func parseFlags() options {
	var o options
	// An own flag set: controller-runtime registers its own --kubeconfig on flag.CommandLine.
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the management cluster (required)")
	// Defaults: upstream's --machinehealthcheck-concurrency, --clustercache-concurrency,
	// --kube-api-qps/--kube-api-burst, --clustercache-client-qps/-burst and --sync-period.
	fs.IntVar(&o.mhcConcurrency, "machinehealthcheck-concurrency", 50, "MachineHealthChecks reconciled at once")
	fs.IntVar(&o.clusterCacheConcurrency, "clustercache-concurrency", 100, "Clusters the cluster cache reconciles at once")
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "client QPS to the management cluster")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "client burst to the management cluster")
	fs.Float64Var(&o.clusterCacheQPS, "clustercache-client-qps", 20, "client QPS of the cluster cache to workload clusters")
	fs.IntVar(&o.clusterCacheBurst, "clustercache-client-burst", 30, "client burst of the cluster cache to workload clusters")
	fs.DurationVar(&o.syncPeriod, "sync-period", 10*time.Minute, "informer resync period")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: exits on a bad flag

	return o
}

func main() {
	o := parseFlags()
	ctrl.SetLogger(klog.Background())
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "capi-mhc: %v\n", err)
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
	return ctrl.NewManager(restConfig, ctrl.Options{
		Scheme: scheme,
		// As upstream with its default feature gates: PriorityQueue on (its ReconcilerRateLimiting
		// gate, also on by default, rate-limits the MachineHealthCheck reconciler through it).
		Controller:             config.Controller{UsePriorityQueue: ptr.To(true), CacheSyncTimeout: 5 * time.Minute},
		LeaderElection:         false,
		HealthProbeBindAddress: "0",
		Metrics:                metricsserver.Options{BindAddress: "0"},
		Cache:                  setup.ManagerCacheOptions(scheme, controllerName, "", o.syncPeriod),
		Client:                 setup.ManagerClientOptions(),
	})
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
	// The reconciler finds a Node's Machine through this field index.
	if err := index.ByMachineNode(ctx, mgr); err != nil {
		return fmt.Errorf("machine node index: %w", err)
	}
	clusterCache, err := newClusterCache(ctx, mgr, o)
	if err != nil {
		return fmt.Errorf("cluster cache: %w", err)
	}
	reconciler := &machinehealthcheck.Reconciler{Client: mgr.GetClient(), ClusterCache: clusterCache}
	if err := reconciler.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: o.mhcConcurrency}); err != nil {
		return fmt.Errorf("machinehealthcheck reconciler: %w", err)
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
	}, controller.Options{MaxConcurrentReconciles: o.clusterCacheConcurrency})
}
