//go:build integration

package agent

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/test/harness"
	dto "github.com/prometheus/client_model/go"
)

// startProxyServerBinary runs upstream's proxy-server binary with its agent listener on agentPort and its
// frontend on a unix socket in dir; uds is that socket.
func startProxyServerBinary(t *testing.T, pki *testPKI, dir string, agentPort int, id string) (p *harness.Proc, uds string) {
	t.Helper()
	cert, key := pki.ca.Server(t, "konnectivity-server", "127.0.0.1").Write(t, dir, id)
	uds = filepath.Join(dir, id+".sock")
	return harness.Start(t, dir, id, nil, harness.UpstreamBinary(t, "proxy-server"), "--mode=grpc", "--uds-name="+uds, "--delete-existing-uds-file",
		"--cluster-cert="+cert, "--cluster-key="+key, "--cluster-ca-cert="+pki.caFile,
		"--server-port=0", "--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(agentPort),
		"--admin-bind-address=127.0.0.1", "--admin-port="+strconv.Itoa(harness.FreePort(t)),
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(harness.FreePort(t)),
		"--server-id="+id, "--server-count=1", "--v=2"), uds
}

// TestUpstreamProxyServerBinary runs konnect's agent against the real upstream proxy-server binary:
// tunnels, a refused dial, and a server restart (kill -9) that the agent recovers from.
func TestUpstreamProxyServerBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the upstream binary")
	}
	pki := newTestPKI(t)
	dir := t.TempDir()
	port := harness.FreePort(t)
	p, uds := startProxyServerBinary(t, pki, dir, port, "upstream-1")
	ra := startAgent(t, pki.config(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))))
	echo := harness.StartEcho(t)

	tunnelWorks := func(uds string) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := (&upstreamServer{uds: uds}).dial(ctx, echo.Addr)
			if err != nil {
				return false
			}
			defer c.Close()
			roundTrip(t, c, 1<<20, 64<<10)
			return true
		}
	}
	harness.EventuallyTrue(t, 20*time.Second, "a tunnel through the upstream proxy-server", tunnelWorks(uds))
	// Upstream's server sends no answer to the flow-control offer: the stream is counted as without it.
	var m dto.Metric
	for fc, want := range map[string]float64{flow.Version: 0, flow.None: 1} {
		if err := ra.m.serverStreams.WithLabelValues(fc).Write(&m); err != nil || m.GetGauge().GetValue() != want {
			t.Errorf("konnect_agent_server_streams{flow_control=%q} = %v (%v), want %v", fc, m.GetGauge().GetValue(), err, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := (&upstreamServer{uds: uds}).dial(ctx, echo.Addr)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, 16<<20, 256<<10)
	c.Close()

	p.Kill()
	harness.EventuallyTrue(t, 10*time.Second, "agent noticed the server died", func() bool { n, _ := ra.Connected(); return n == 0 })
	_, uds2 := startProxyServerBinary(t, pki, dir, port, "upstream-2")
	harness.EventuallyTrue(t, 20*time.Second, "a tunnel after the server restarted", tunnelWorks(uds2))
	if st := ra.Status(); len(st) != 1 || st[0].ServerID != "upstream-2" {
		t.Fatalf("status %+v", st)
	}
}
