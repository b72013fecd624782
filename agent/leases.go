package agent

import (
	"context"
	"fmt"
	"time"

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

// StartLeaseCounter implements proxy-agent's --count-server-leases: it watches the servers' Lease objects
// and returns a function that counts the valid ones, for Config.ServerCount, and one that waits until the
// watch has synced, which must return nil before the count means anything. Like proxy-agent, it waits for
// as long as that takes (kube-apiserver may be down while the agent starts), saying so every 30 s, and
// returns an error only when its ctx ends first. It uses upstream's lease counter, so the count means
// exactly what it means for proxy-agent. The watch stops when ctx ends.
func StartLeaseCounter(ctx context.Context, kubeconfig, namespace, selector, contentType string) (count func() int, synced func(context.Context) error, err error) {
	var cfg *rest.Config
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("lease counting: kubernetes client config: %w", err)
	}
	cfg.ContentType = contentType
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("lease counting: %w", err)
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, nil, fmt.Errorf("lease counting: label selector %q: %w", selector, err)
	}
	informer := upstreamagent.NewLeaseInformerWithMetrics(client, namespace, 10*time.Second)
	go informer.Run(ctx.Done())
	synced = func(wait context.Context) error {
		began := time.Now()
		for {
			round, cancel := context.WithTimeout(wait, leaseSyncReport)
			ok := cache.WaitForCacheSync(round.Done(), informer.HasSynced)
			cancel()
			switch {
			case ok:
				return nil
			case wait.Err() != nil:
				return fmt.Errorf("lease counting: leases in namespace %q did not sync: %w", namespace, wait.Err())
			}
			klog.InfoS("Waiting for the server leases before connecting; the lease watch's errors say why",
				"namespace", namespace, "waited", time.Since(began).Round(time.Second))
		}
	}
	counter := upstreamagent.NewServerLeaseCounter(clock.RealClock{}, coordinationv1lister.NewLeaseLister(informer.GetIndexer()), sel)
	return counter.Count, synced, nil
}
