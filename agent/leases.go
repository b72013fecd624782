package agent

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/konnect-dev/konnect/pki/smallfile"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	coordinationv1lister "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	upstreamagent "sigs.k8s.io/apiserver-network-proxy/pkg/agent"
)

// leaseSyncReport is how often the wait for the lease watch says that it still waits.
const leaseSyncReport = 30 * time.Second

// LeaseCounter implements proxy-agent's --count-server-leases: it watches the servers' Lease objects and
// counts the valid ones, for Config.ServerCount. It uses upstream's lease counter, so the count means exactly
// what it means for proxy-agent.
type LeaseCounter struct {
	namespace string
	informer  cache.SharedIndexInformer
	counter   *upstreamagent.ServerLeaseCounter
	waitSince atomic.Int64 // WaitForSync's start in Unix nanoseconds; 0 before
}

// NewLeaseCounter builds the client, the watch and the counter, and starts nothing: Run runs the watch.
func NewLeaseCounter(kubeconfig, namespace, selector, contentType string) (*LeaseCounter, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		// client-go reads it whole and would block on a FIFO: refused first, as every file the agent reads.
		if err = smallfile.Check(kubeconfig); err == nil {
			cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		}
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("lease counting: kubernetes client config: %w", err)
	}
	cfg.ContentType = contentType
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("lease counting: %w", err)
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("lease counting: label selector %q: %w", selector, err)
	}
	informer := upstreamagent.NewLeaseInformerWithMetrics(client, namespace, 10*time.Second)
	return &LeaseCounter{
		namespace: namespace,
		informer:  informer,
		counter:   upstreamagent.NewServerLeaseCounter(clock.RealClock{}, coordinationv1lister.NewLeaseLister(informer.GetIndexer()), sel),
	}, nil
}

// Count counts the valid leases, for Config.ServerCount. It means nothing before WaitForSync returned nil.
func (l *LeaseCounter) Count() int { return l.counter.Count() }

// Run watches the leases until ctx ends, and returns then. The watch itself may end later: upstream's list
// request cannot be cancelled (it runs on context.TODO), and one to a kube-apiserver that does not answer
// would hold a stop for as long as it hangs.
func (l *LeaseCounter) Run(ctx context.Context) error {
	go l.informer.Run(ctx.Done())
	<-ctx.Done()
	return nil
}

// WaitForSync waits until the watch has synced. Like proxy-agent, it waits for as long as that takes
// (kube-apiserver may be down while the agent starts), saying so every 30 s, and returns an error only when
// ctx ends first.
func (l *LeaseCounter) WaitForSync(ctx context.Context) error {
	began := time.Now()
	l.waitSince.CompareAndSwap(0, began.UnixNano())
	for {
		round, cancel := context.WithTimeout(ctx, leaseSyncReport)
		ok := cache.WaitForCacheSync(round.Done(), l.informer.HasSynced)
		cancel()
		switch {
		case ok:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("lease counting: leases in namespace %q did not sync: %w", l.namespace, ctx.Err())
		}
		klog.InfoS("Waiting for the server leases before connecting; the lease watch's errors say why",
			"namespace", l.namespace, "waited", time.Since(began).Round(time.Second))
	}
}

// Waiting says that the agent waits for the leases, and since when, for its initial-sync check.
func (l *LeaseCounter) Waiting() string {
	what := fmt.Sprintf("waiting for the server leases in namespace %q to sync before connecting", l.namespace)
	if since := l.waitSince.Load(); since != 0 {
		what += fmt.Sprintf(" (for %s; the log has the lease watch's errors)", time.Since(time.Unix(0, since)).Round(time.Second))
	}
	return what
}
