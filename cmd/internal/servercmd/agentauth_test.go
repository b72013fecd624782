package servercmd

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestServerRefusesUnauthenticatedAgents: with neither --cluster-ca-cert nor the token flags, the server does
// not start, and says which flags give agents a way to authenticate; --allow-unauthenticated-agents starts it,
// with a warning every time. Upstream starts such a server silently.
func TestServerRefusesUnauthenticatedAgents(t *testing.T) {
	dir := t.TempDir()
	_, sc, sk, _, _ := writePKI(t, dir)
	args := []string{"--uds-name=" + filepath.Join(dir, "s.sock"), "--cluster-cert=" + sc, "--cluster-key=" + sk,
		"--server-port=0", "--agent-port=0", "--admin-port=0", "--health-port=0", "--agent-bind-address=127.0.0.1"}
	cmd := NewServerCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		t.Fatal("a server without agent authentication started")
	}
	for _, flag := range []string{"--cluster-ca-cert", "--agent-namespace", "--agent-service-account", "--authentication-audience", "--kubeconfig", "--allow-unauthenticated-agents"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("the refusal does not name %s: %v", flag, err)
		}
	}

	logs := harness.CaptureKlog(t)
	o := NewOptions()
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(append(args, "--allow-unauthenticated-agents")); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.Config()
	if err != nil {
		t.Fatalf("--allow-unauthenticated-agents: %v", err)
	}
	if !cfg.Tunnel.AllowUnauthenticatedAgents {
		t.Fatal("the opt-out did not reach the tunnel's config")
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if l := logs(); !strings.Contains(l, "Agents are not authenticated") || !strings.Contains(l, "--allow-unauthenticated-agents") {
		t.Errorf("no warning at start:\n%s", l)
	}
}

// TestTokenReviewClients: agents' TokenReviews and /readyz's go through clients of their own, so that
// neither waits for the other's rate limiter; the agents' has none unless --kubeconfig-qps is given
// (--max-concurrent-token-reviews bounds it), the other keeps client-go's default as upstream's does.
func TestTokenReviewClients(t *testing.T) {
	dir := t.TempDir()
	_, sc, sk, _, _ := writePKI(t, dir)
	kc := filepath.Join(dir, "kubeconfig")
	caCert := pkitest.NewCA(t, "apiserver")
	if err := pkitest.WriteKubeconfig(kc, clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: caCert.CertPEM},
		clientcmdapi.AuthInfo{Token: "t"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		extra        []string
		reviewsLimit bool
	}{
		{nil, false},
		{[]string{"--kubeconfig-qps=50", "--kubeconfig-burst=100"}, true},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(append([]string{"--uds-name=" + filepath.Join(dir, "s.sock"), "--cluster-cert=" + sc, "--cluster-key=" + sk,
			"--server-port=0", "--kubeconfig=" + kc, "--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent",
			"--authentication-audience=system:konnectivity-server"}, tc.extra...)); err != nil {
			t.Fatal(err)
		}
		cfg, err := o.Config()
		if err != nil {
			t.Fatal(err)
		}
		ta := cfg.Tunnel.TokenAuth
		if ta == nil || ta.Client == nil || ta.ProbeClient == nil || ta.Client == ta.ProbeClient {
			t.Fatalf("%v: want two clients, got %+v", tc.extra, ta)
		}
		reviews := ta.Client.AuthenticationV1().RESTClient().GetRateLimiter()
		probes := ta.ProbeClient.AuthenticationV1().RESTClient().GetRateLimiter()
		if (reviews != nil) != tc.reviewsLimit || probes == nil || reviews == probes {
			t.Errorf("%v: agents' rate limiter %v, /readyz's %v", tc.extra, reviews, probes)
		}
		if ta.CacheTTL != o.TokenReviewCacheTTL || ta.MaxConcurrentReviews != 32 {
			t.Errorf("cache %v, concurrency %d", ta.CacheTTL, ta.MaxConcurrentReviews)
		}
	}
}
