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
	"k8s.io/utils/clock"
	upstreamagent "sigs.k8s.io/apiserver-network-proxy/pkg/agent"
)

// StartLeaseCounter implements proxy-agent's --count-server-leases: it watches the servers' Lease objects
// and returns a function that counts the valid ones, for Config.ServerCount, and one that waits until the
// watch has synced (at most 30 s, or until its ctx ends), which must return nil before the count means
// anything. It uses upstream's lease counter, so the count means exactly what it means for proxy-agent. The
// watch stops when ctx ends.
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
		wait, cancel := context.WithTimeout(wait, 30*time.Second)
		defer cancel()
		if !cache.WaitForCacheSync(wait.Done(), informer.HasSynced) {
			return fmt.Errorf("lease counting: leases in namespace %q did not sync within 30s", namespace)
		}
		return nil
	}
	counter := upstreamagent.NewServerLeaseCounter(clock.RealClock{}, coordinationv1lister.NewLeaseLister(informer.GetIndexer()), sel)
	return counter.Count, synced, nil
}
