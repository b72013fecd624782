package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/test/harness"
)

// konnectServer is konnect's own server (egress/tunnel), the agent's usual peer.
type konnectServer struct {
	srv *tunnel.Server
	fe  tunnel.Frontend
}

func startKonnectServer(tb testing.TB, pki *testPKI, id string, count int, mode string) *konnectServer {
	tb.Helper()
	dir, err := os.MkdirTemp("", "konnect-srv")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	certFile, keyFile := pki.ca.Server(tb, "konnectivity-server", "127.0.0.1").Write(tb, dir, "server")
	cfg := &tunnel.Config{
		ServerID:        id,
		ServerCount:     count,
		Mode:            mode,
		UDSName:         filepath.Join(dir, "konnectivity.sock"),
		AgentAddr:       "127.0.0.1:0",
		ClusterCert:     certFile,
		ClusterKey:      keyFile,
		ClusterCA:       pki.caFile,
		GracefulTimeout: time.Second,
	}
	s, err := tunnel.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	harness.RunDaemon(tb, cfg.GracefulTimeout, s.Run)
	return &konnectServer{srv: s, fe: tunnel.Frontend{UDSName: cfg.UDSName, Mode: mode}}
}

func (k *konnectServer) agents() int { return len(k.srv.Status().Agents) }

func (k *konnectServer) connectedAgents() int {
	n := 0
	for _, a := range k.srv.Status().Agents {
		if a.Connected {
			n++
		}
	}
	return n
}

func TestWithKonnectServer(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			pki := newTestPKI(t)
			ks := startKonnectServer(t, pki, "k1", 1, mode)
			startAgent(t, pki.config(ks.srv.AgentAddr()))
			harness.EventuallyTrue(t, 10*time.Second, "agent connected", func() bool { return ks.connectedAgents() == 1 })
			echo := harness.StartEcho(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, tc := range []struct {
				name        string
				size, chunk int
			}{
				{"small", 1000, 1000},
				{"64MiB", 64 << 20, 256 << 10},
				{"16MiB single write", 16 << 20, 16 << 20},
			} {
				t.Run(tc.name, func(t *testing.T) {
					c, err := ks.fe.Dial(ctx, echo.Addr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					roundTrip(t, c, tc.size, tc.chunk)
				})
			}
			refused, _ := net.Listen("tcp", "127.0.0.1:0")
			addr := refused.Addr().String()
			refused.Close()
			_, err := ks.fe.Dial(ctx, addr)
			if err == nil || !strings.Contains(err.Error(), "dial tcp "+addr+": connect: connection refused") {
				t.Fatalf("dial to a closed port: %v", err)
			}
		})
	}
}

func TestTwoKonnectServers(t *testing.T) {
	pki := newTestPKI(t)
	k1 := startKonnectServer(t, pki, "k1", 2, "grpc")
	k2 := startKonnectServer(t, pki, "k2", 2, "grpc")
	ra := startAgent(t, pki.config(k1.srv.AgentAddr(), k2.srv.AgentAddr()))
	harness.EventuallyTrue(t, 10*time.Second, "agent on both", func() bool { return k1.connectedAgents() == 1 && k2.connectedAgents() == 1 })
	echo := harness.StartEcho(t)
	for _, k := range []*konnectServer{k1, k2} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := k.fe.Dial(ctx, echo.Addr)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, c, 1<<20, 64<<10)
		c.Close()
	}
	if n, known := ra.Connected(); n != 2 || known != 2 {
		t.Fatalf("Connected() = %d, %d", n, known)
	}
}

// BenchmarkTunnelEndToEnd compares the whole konnect tunnel (konnect server + konnect agent) with the whole
// upstream tunnel (upstream server library + upstream agent library), downloading through the UDS.
//
//	go test -run '^$' -bench TunnelEndToEnd -benchtime 5x ./agent/
func BenchmarkTunnelEndToEnd(b *testing.B) {
	const size = 64 << 20
	pki := newTestPKI(b)
	source := sourceServer(b, size)
	type tun struct {
		name string
		dial func(context.Context, string) (net.Conn, error)
	}
	var tuns []tun
	ks := startKonnectServer(b, pki, "k1", 1, "grpc")
	cfg := pki.config(ks.srv.AgentAddr())
	cfg.GracefulTimeout = -1
	startAgent(b, cfg)
	harness.EventuallyTrue(b, 10*time.Second, "konnect agent connected", func() bool { return ks.connectedAgents() == 1 })
	tuns = append(tuns, tun{"konnect", ks.fe.Dial})
	us := startUpstreamServer(b, serverOpts{id: "u1", ca: pki.ca})
	startUpstreamAgent(b, pki, us.agentAddr)
	harness.EventuallyTrue(b, 10*time.Second, "upstream agent connected", func() bool { return us.backends() == 1 })
	tuns = append(tuns, tun{"upstream", us.dial})

	for _, streams := range []int{1, 8} {
		for _, tn := range tuns {
			b.Run(fmt.Sprintf("tunnel=%s/streams=%d", tn.name, streams), func(b *testing.B) {
				b.SetBytes(int64(size * streams))
				defer harness.ReportCPU(b, int64(size*streams))()
				for b.Loop() {
					if err := downloadParallel(tn.dial, source, size, streams); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
