//go:build integration

package reliability

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	agentpb "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// agentPortTLS is what a peer of the agent port needs to finish a TLS handshake in token mode: the CA of
// the server's certificate in dir, and no client certificate.
func agentPortTLS(t *testing.T, dir string) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
}

// serverMetric sums the samples of one metric on the server's /metrics whose labels contain every one of
// labels.
func serverMetric(t *testing.T, healthPort int, name string, labels ...string) float64 {
	t.Helper()
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", healthPort))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	return sumMetric(bufio.NewScanner(res.Body), name, labels...)
}

func sumMetric(sc *bufio.Scanner, name string, labels ...string) float64 {
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if i := strings.LastIndexByte(line, ' '); ok && i > 0 {
			v, _ := strconv.ParseFloat(line[i+1:], 64)
			sum += v
		}
	}
	return sum
}

// startTokenAPIServer starts a real kube-apiserver on ports[0] (etcd on ports[1] and ports[2]) prepared for
// agents that authenticate by token, and returns it with the kubeconfig, in dir, of the server's user.
func startTokenAPIServer(t *testing.T, ctx context.Context, dir string, ports []int) (*harness.APIServer, string) {
	t.Helper()
	api := harness.StartAPIServer(t, harness.APIServerOptions{Bin: harness.E2ETool(t, "kube-apiserver"),
		Dir: filepath.Join(shortDir(t), "api"), Host: "127.0.0.1", Port: ports[0], EtcdPorts: [2]int{ports[1], ports[2]}})
	kubeconfig := filepath.Join(dir, "tokenreview.kubeconfig")
	if err := api.AgentAuth(ctx, agentNamespace, agentSA, "system:konnectivity-server", kubeconfig); err != nil {
		t.Fatal(err)
	}
	return api, kubeconfig
}

// TestTokenReviewFlood floods a konnect server that authenticates agents by token against a real
// kube-apiserver: one TLS connection opens 500 Connect streams with bogus tokens, and a genuine agent starts
// meanwhile. The genuine agent connects within a few seconds (alone it takes a fraction of one), and the
// flood costs kube-apiserver one TokenReview. Upstream (and konnect before) sent 500 TokenReviews through
// a client limited to 5 per second that the genuine agent's review and /readyz shared: the agent waited
// behind the flood for most of two minutes. Once the genuine agent has gone, 500 more refusals under
// made-up agent IDs, a connection each, leave it in the server's status (konnect doctor's source): before,
// they pushed it out.
func TestTokenReviewFlood(t *testing.T) {
	dir := copyBase(t)
	ports := harness.FreePorts(t, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	api, kubeconfig := startTokenAPIServer(t, ctx, dir, ports)
	tokens, err := api.Tokens(ctx, agentNamespace, agentSA, agentAudience, time.Hour, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	tokenPath := filepath.Join(shortDir(t), "token")
	writeFile(t, tokenPath, tokens[0])
	sp := serverPorts{ports[3], ports[4], ports[5]}
	server := startKonnect(t, "server", serverArgs(dir, filepath.Join(shortDir(t), "s.sock"), sp,
		"--kubeconfig", kubeconfig, "--agent-namespace", agentNamespace, "--agent-service-account", agentSA,
		"--authentication-audience", agentAudience)...)
	waitReady(t, server, sp.health)
	reviewsBefore := apiserverTokenReviews(t, ctx, api)

	cc, err := grpc.NewClient("passthrough:///127.0.0.1:"+strconv.Itoa(sp.agent), grpc.WithTransportCredentials(credentials.NewTLS(agentPortTLS(t, dir))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const streams = 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			sctx = metadata.AppendToOutgoingContext(sctx, header.AgentID, fmt.Sprintf("flood-%d", i),
				header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+fmt.Sprintf("bogus-token-%d", i))
			st, err := agentpb.NewAgentServiceClient(cc).Connect(sctx)
			if err != nil {
				return
			}
			if h, err := st.Header(); err == nil && len(h.Get(header.ServerID)) == 1 {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		}()
	}
	// The genuine agent starts once the flood has reached kube-apiserver.
	harness.EventuallyTrue(t, 10*time.Second, "the flood's TokenReviews at kube-apiserver", func() bool {
		return apiserverTokenReviews(t, ctx, api) > reviewsBefore
	})
	start := time.Now()
	agentPorts := harness.FreePorts(t, 2)
	agent := startKonnect(t, "agent", agentArgs(dir, []int{sp.agent}, agentPorts[0], agentPorts[1],
		"--service-account-token-path", tokenPath, "--agent-id", "genuine")...)
	harness.Eventually(t, 5*time.Second, "the genuine agent connected during the flood", func() error {
		if !agent.Running() {
			t.Fatalf("the agent exited:\n%s", harness.Tail(agent.Log(), 3000))
		}
		ids, err := connectedAgents(sp.admin)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if id == "genuine" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	t.Logf("the genuine agent connected %v after it started, during a flood of %d Connect streams", time.Since(start).Round(time.Millisecond), streams)
	wg.Wait()
	if accepted > 0 {
		t.Fatalf("%d streams with bogus tokens were accepted", accepted)
	}
	rejected := serverMetric(t, sp.health, "konnect_tunnel_server_agent_token_reviews_total", `result="rejected"`)
	authenticated := serverMetric(t, sp.health, "konnect_tunnel_server_agent_token_reviews_total", `result="authenticated"`)
	if rejected != 1 || authenticated != 1 {
		t.Errorf("the server sent %v rejected and %v accepted TokenReviews for agents; want 1 and 1", rejected, authenticated)
	}
	// kube-apiserver's own count agrees (readiness probes may add a few of their own).
	sent := apiserverTokenReviews(t, ctx, api) - reviewsBefore
	readiness := serverMetric(t, sp.health, "konnect_tunnel_server_readiness_token_reviews_total")
	if sent > 2+readiness {
		t.Errorf("kube-apiserver got %v TokenReviews during the flood; want 2 for the agents and at most %v for /readyz", sent, readiness)
	}
	t.Logf("kube-apiserver answered %v TokenReviews for a flood of %d streams and one genuine agent", sent, streams)

	// The status remembers the genuine agent once it has gone, however many made-up IDs are refused after
	// it: their refusals push out only each other.
	if err := agent.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the genuine agent listed as disconnected", func() error {
		listed, err := listedAgents(sp.admin)
		if err != nil {
			return err
		}
		if connected, ok := listed["genuine"]; !ok || connected {
			return fmt.Errorf("genuine: listed %v, connected %v", ok, connected)
		}
		return nil
	})
	// The server lets a connection that has not authenticated try one stream, so this flood opens a
	// connection for each, 16 at a time.
	refusedAfter := 0
	work := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				c, err := grpc.NewClient("passthrough:///127.0.0.1:"+strconv.Itoa(sp.agent), grpc.WithTransportCredentials(credentials.NewTLS(agentPortTLS(t, dir))))
				if err != nil {
					continue
				}
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				sctx = metadata.AppendToOutgoingContext(sctx, header.AgentID, fmt.Sprintf("later-%d", i),
					header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+fmt.Sprintf("bogus-later-%d", i))
				if st, err := agentpb.NewAgentServiceClient(c).Connect(sctx); err == nil {
					if _, err := st.Recv(); err != nil {
						mu.Lock()
						refusedAfter++
						mu.Unlock()
					}
				}
				cancel()
				c.Close()
			}
		}()
	}
	for i := range streams {
		work <- i
	}
	close(work)
	wg.Wait()
	listed, err := listedAgents(sp.admin)
	if err != nil {
		t.Fatal(err)
	}
	if refusedAfter != streams {
		t.Fatalf("%d of %d streams with bogus tokens refused", refusedAfter, streams)
	}
	if _, ok := listed["genuine"]; !ok {
		t.Errorf("the status forgot the genuine agent after %d refusals under made-up IDs (it lists %d agents)", streams, len(listed))
	}
	if len(listed) > 64+1 {
		t.Errorf("the status lists %d agents after refusals under %d made-up IDs; want at most 64 of them", len(listed), streams)
	}
	t.Logf("after %d refusals under made-up IDs the status lists %d agents", streams, len(listed))
}

// apiserverTokenReviews is how many TokenReviews kube-apiserver has answered, from its own metrics.
func apiserverTokenReviews(t *testing.T, ctx context.Context, api *harness.APIServer) float64 {
	t.Helper()
	cs, err := api.Client()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return sumMetric(bufio.NewScanner(strings.NewReader(string(raw))), "apiserver_request_total", `resource="tokenreviews"`)
}

// TestAgentPortBoundsIdlePeers sends konnect server (token mode, the default of konnect init, all flags at
// their defaults) what a hostile peer of its agent port would: 200 TCP connections that never start TLS and
// 200 TLS+HTTP/2 connections that never open a stream, from 8 source addresses, and 100 more from one
// address. Those beyond the per-source bound are reset at once; the others are closed within the handshake
// timeout (5 s) or the authentication timeout (10 s). gRPC's defaults kept them all 120 s, and forever once
// HTTP/2 was up. A genuine agent connects meanwhile, and stays.
func TestAgentPortBoundsIdlePeers(t *testing.T) {
	t.Parallel() // waits on timeouts
	dir := copyBase(t)
	tr := newTokenReviewer(t)
	ports := harness.FreePorts(t, 5)
	sp := serverPorts{ports[0], ports[1], ports[2]}
	server := startKonnect(t, "server", serverArgs(dir, filepath.Join(shortDir(t), "s.sock"), sp, tokenServerArgs(tr.kubeconfig(t, dir))...)...)
	waitReady(t, server, sp.health)
	addr := "127.0.0.1:" + strconv.Itoa(sp.agent)
	tokenPath := filepath.Join(shortDir(t), "token")
	writeFile(t, tokenPath, tr.goodAgentToken())
	agent := startKonnect(t, "agent", agentArgs(dir, []int{sp.agent}, ports[3], ports[4], "--service-account-token-path", tokenPath, "--agent-id", "genuine")...)
	expectConnected(t, sp.admin, agent, "genuine")

	dial := func(src string) (net.Conn, error) { return harness.DialFrom(src, addr) }
	start := time.Now()
	var raw, idle []net.Conn
	defer func() {
		for _, c := range append(raw, idle...) {
			c.Close()
		}
	}()
	for i := range 200 {
		c, err := dial(fmt.Sprintf("127.0.0.%d", 10+i%8))
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, c)
	}
	tlsCfg := agentPortTLS(t, dir)
	for i := range 200 {
		c, err := dial(fmt.Sprintf("127.0.0.%d", 20+i%8))
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, tlsCfg)
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS handshake %d: %v", i, err)
		}
		if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
			t.Fatal(err)
		}
		if err := http2.NewFramer(tc, tc).WriteSettings(); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, tc)
	}
	// 100 from one address: the first 64 (the per-source bound) are kept until they time out, the rest
	// reset at once.
	resetAtOnce := 0
	var one []net.Conn
	for range 100 {
		c, err := dial("127.0.0.30")
		if err != nil { // reset before the dial returned
			resetAtOnce++
			continue
		}
		one = append(one, c)
	}
	time.Sleep(300 * time.Millisecond)
	for _, c := range one {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			resetAtOnce++
		}
	}
	raw = append(raw, one...)
	if resetAtOnce < 36 {
		t.Errorf("%d of 100 unauthenticated connections from one address were reset at once; want at least 36 (the bound is 64)", resetAtOnce)
	}
	for what, set := range map[string]struct {
		conns []net.Conn
		bound time.Duration
	}{"raw TCP": {raw, 5 * time.Second}, "TLS+HTTP/2 without a stream": {idle, 10 * time.Second}} {
		// Twice the bound, and 3 s more: under a loaded CI run (go test ./... with -race beside it) the server
		// was seen to close them up to 3 s late. gRPC's defaults would keep them 120 s, or forever.
		for _, c := range set.conns {
			if err := waitClosed(c, start.Add(2*set.bound+3*time.Second)); err != nil {
				t.Fatalf("%s connection still open %v after it was made: %v", what, time.Since(start).Round(time.Second), err)
			}
		}
	}
	t.Logf("all %d hostile connections closed %v after the first was made", len(raw)+len(idle), time.Since(start).Round(100*time.Millisecond))
	for _, stage := range []string{"handshake", "auth"} {
		if n := serverMetric(t, sp.health, "konnect_tunnel_server_unauthenticated_connections_timed_out_total", `stage="`+stage+`"`); n < 200 {
			t.Errorf("connections timed out at the %s stage: %v counted, want at least 200", stage, n)
		}
	}
	// The genuine agent is still connected.
	if ids, err := connectedAgents(sp.admin); err != nil || len(ids) != 1 || ids[0] != "genuine" {
		t.Fatalf("connected agents after the flood: %v %v", ids, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitClosed reads from c until the server closes it; it returns an error if c is still open at deadline.
func waitClosed(c net.Conn, deadline time.Time) error {
	_ = c.SetReadDeadline(deadline)
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if isTimeout(err) {
			return err
		}
		return nil
	}
}
