package main

import (
	"path/filepath"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
)

// startAPIServer runs etcd and kube-apiserver 1.36 in cp (harness.APIServer), trusting the cluster CA that
// konnect init made, once for the whole run, and returns it. Its admin kubeconfig serves `konnect proxy` and
// `kubectl proxy` (row 7); the storm (row 10) reviews agents' tokens with it.
func (b *bench) startAPIServer() (*harness.APIServer, error) {
	if b.api != nil {
		return b.api, nil
	}
	pki := b.path("k", "pki")
	ca, err := pkitest.Load(filepath.Join(pki, "ca.crt"), filepath.Join(pki, "ca.key"))
	if err != nil {
		return nil, err
	}
	api, err := harness.NewAPIServer(harness.APIServerOptions{Bin: b.o.kubeAPIServer, Dir: b.path("apiserver"),
		Host: cpAddr, Port: 6443, Netns: b.t.ns("cp"), CA: ca, Keep: b.t.keep})
	if api != nil {
		b.t.procs = append(b.t.procs, &proc{api.Etcd}, &proc{api.Proc})
	}
	if err != nil {
		return nil, err
	}
	if err := api.WaitReady(3 * time.Minute); err != nil {
		return nil, err
	}
	b.api = api
	return api, nil
}
