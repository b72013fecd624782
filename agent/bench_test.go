package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/wire"
	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	upagent "sigs.k8s.io/apiserver-network-proxy/pkg/agent"
)

// startUpstreamAgent runs upstream's agent library (pkg/agent), configured as its proxy-agent binary
// configures it, as the baseline.
func startUpstreamAgent(tb testing.TB, pki *testPKI, addr string) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.ca.CertPEM)
	kp, err := tls.LoadX509KeyPair(pki.certFile, pki.keyFile)
	if err != nil {
		tb.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(addr)
	tlsCfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, ServerName: host, MinVersion: tls.VersionTLS12}
	cc := &upagent.ClientSetConfig{
		Address:           addr,
		AgentID:           "upstream-agent",
		SyncInterval:      100 * time.Millisecond,
		ProbeInterval:     time.Second,
		SyncIntervalCap:   time.Second,
		DialOptions:       []grpc.DialOption{grpc.WithTransportCredentials(grpccreds.NewTLS(tlsCfg))},
		XfrChannelSize:    150,
		ServerCountSource: "default",
	}
	drain, stop := make(chan struct{}), make(chan struct{})
	cs := cc.NewAgentClientSet(drain, stop)
	cs.SetServerCounter(upagent.NewAggregateServerCounter(nil, upagent.NewResponseBasedCounter(cs), "default"))
	cs.Serve()
	tb.Cleanup(func() { close(stop) })
}

// sourceServer waits for one byte from the client (like an HTTP request), then writes size bytes and
// closes the connection. (A client that stops reading mid-stream and closes would meet konnectivity-client's
// 10 s read timeout: its receive loop blocks on the abandoned connection.)
func sourceServer(tb testing.TB, size int) string {
	buf := make([]byte, 256<<10)
	return harness.Serve(tb, func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return
		}
		for left := size; left > 0; left -= len(buf) {
			if _, err := c.Write(buf[:min(left, len(buf))]); err != nil {
				return
			}
		}
	}).Addr
}

// sinkAckServer reads `size` bytes from each connection, then answers one byte.
func sinkAckServer(tb testing.TB, size int64) string {
	return harness.Serve(tb, func(c net.Conn) {
		if _, err := io.CopyN(io.Discard, c, size); err == nil {
			c.Write([]byte{1})
		}
	}).Addr
}

// BenchmarkTunnelBulk measures bulk throughput through the whole tunnel: konnectivity-client over the
// server's UDS → upstream's server (pkg/server) → TLS gRPC → agent → loopback backend. konnect's agent and
// upstream's agent (pkg/agent) run on the same server in the same process, so only the agent differs.
//
//	go test -run '^$' -bench TunnelBulk -benchtime 5x ./agent/
func BenchmarkTunnelBulk(b *testing.B) {
	const size = 64 << 20
	pki := newTestPKI(b)
	for _, impl := range []string{"konnect", "upstream"} {
		srv := startUpstreamServer(b, serverOpts{id: impl, ca: pki.ca})
		var ra *runningAgent
		if impl == "konnect" {
			cfg := pki.config(srv.agentAddr)
			cfg.GracefulTimeout = -1
			if v := os.Getenv("KONNECT_BENCH_READ_BUFFER"); v != "" {
				cfg.ReadBuffer, _ = strconv.Atoi(v)
			}
			ra = startAgent(b, cfg)
		} else {
			startUpstreamAgent(b, pki, srv.agentAddr)
		}
		harness.EventuallyTrue(b, 10*time.Second, impl+" agent connected", func() bool { return srv.backends() == 1 })
		source := sourceServer(b, size)
		sink := sinkAckServer(b, size)

		for _, streams := range []int{1, 8} {
			b.Run(fmt.Sprintf("agent=%s/dir=download/streams=%d", impl, streams), func(b *testing.B) {
				b.SetBytes(int64(size * streams))
				defer harness.ReportCPU(b, int64(size*streams))()
				for b.Loop() {
					if err := downloadParallel(srv.dial, source, size, streams); err != nil {
						if ra != nil {
							b.Logf("agent sent %v bytes in %v packets; overflows %v", counterValue(ra.m.bytesToServer), counterValue(ra.m.dataToServer), counterValue(ra.m.overflows))
						}
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("agent=%s/dir=upload/streams=1", impl), func(b *testing.B) {
			b.SetBytes(size)
			defer harness.ReportCPU(b, size)()
			chunk := make([]byte, 256<<10)
			for b.Loop() {
				c, err := srv.dial(context.Background(), sink)
				if err != nil {
					b.Fatal(err)
				}
				for off := 0; off < size; off += len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
		srv.stop()
	}
}

func TestMain(m *testing.M) {
	// -args -v=4 shows the agent's logs.
	klog.InitFlags(nil)
	flag.Parse()
	wire.Pool = testPool // before any goroutine reads it (zerocopy_test.go)
	code := m.Run()
	harness.RemoveUpstreamBinaries()
	os.Exit(code)
}

// downloadParallel downloads size bytes from source (a sourceServer) over each of streams tunnels at once.
func downloadParallel(dial func(context.Context, string) (net.Conn, error), source string, size, streams int) error {
	var g errgroup.Group
	for range streams {
		g.Go(func() error {
			c, err := dial(context.Background(), source)
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Write([]byte{1}); err != nil {
				return err
			}
			n, err := io.Copy(io.Discard, c)
			if err == nil && n != int64(size) {
				err = fmt.Errorf("got %d bytes, want %d", n, size)
			}
			return err
		})
	}
	return g.Wait()
}
