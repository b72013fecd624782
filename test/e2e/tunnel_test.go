//go:build e2e

package e2e

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// impl says which program plays a tunnel end: konnect, or the upstream
// apiserver-network-proxy v0.36.0 binary. konnect accepts upstream's flags,
// so both get the same arguments.
type impl string

const (
	implKonnect  impl = "konnect"
	implUpstream impl = "upstream"
)

func (i impl) serverArgv() []string {
	if i == implUpstream {
		return []string{bins.proxyServer}
	}
	// A short drain keeps the scenarios fast; the default is 15 s.
	return []string{bins.konnect, "server", "--graceful-timeout=3s"}
}

func (i impl) agentArgv() []string {
	if i == implUpstream {
		return []string{bins.proxyAgent}
	}
	return []string{bins.konnect, "agent", "--graceful-timeout=3s"}
}

// Ports of the first tunnel server in cp: the ones konnect's generated
// static pod and DaemonSet use. A second server adds 10.
const (
	agentPort  = 8132
	adminPort  = 8133
	healthPort = 8134
)

type serverOpts struct {
	impl        impl
	id          string
	portOffset  int    // added to every port, for a second server
	uds         string // defaults to the cluster's udsName
	serverCount int
	extra       []string
}

type tunnelServer struct {
	opts       serverOpts
	p          *proc
	agentPort  int
	healthPort int
	adminPort  int
	uds        string
}

// serverArgs are upstream proxy-server flags for the cluster's egress mode.
func (c *cluster) serverArgs(o serverOpts) []string {
	args := []string{
		"--mode=" + c.mode.mode,
		"--cluster-cert=" + filepath.Join(c.pki, "konnectivity-server.crt"),
		"--cluster-key=" + filepath.Join(c.pki, "konnectivity-server.key"),
		fmt.Sprintf("--agent-port=%d", agentPort+o.portOffset),
		fmt.Sprintf("--admin-port=%d", adminPort+o.portOffset),
		fmt.Sprintf("--health-port=%d", healthPort+o.portOffset),
		"--agent-namespace=kube-system",
		"--agent-service-account=konnectivity-agent",
		"--kubeconfig=" + filepath.Join(c.konnectDir, "konnectivity-server.conf"),
		"--authentication-audience=system:konnectivity-server",
		"--server-id=" + o.id,
		fmt.Sprintf("--server-count=%d", max(o.serverCount, 1)),
		// Agents in w2 cannot reach the pod address: route by destination,
		// as a real cluster with per-node agents must.
		"--proxy-strategies=destHost,default",
	}
	switch c.mode.transport {
	case "uds":
		uds := o.uds
		if uds == "" {
			uds = c.udsName
		}
		args = append(args, "--uds-name="+uds, "--delete-existing-uds-file", "--server-port=0")
	case "tcp":
		hostPort, _ := urlHostPort(c.frontendURL)
		host, port, _ := net.SplitHostPort(hostPort)
		args = append(args,
			"--server-bind-address="+host,
			"--server-port="+port,
			"--server-cert="+filepath.Join(c.pki, "konnectivity-frontend.crt"),
			"--server-key="+filepath.Join(c.pki, "konnectivity-frontend.key"),
			"--server-ca-cert="+filepath.Join(c.pki, "ca.crt"),
		)
	}
	return append(args, o.extra...)
}

// startServer starts a tunnel server in cp and waits until it answers
// /healthz. It is stopped when t ends.
func (c *cluster) startServer(t *testing.T, o serverOpts) *tunnelServer {
	t.Helper()
	if o.id == "" {
		o.id = "server-" + strconv.Itoa(o.portOffset/10)
	}
	s := &tunnelServer{opts: o, agentPort: agentPort + o.portOffset, healthPort: healthPort + o.portOffset, adminPort: adminPort + o.portOffset}
	s.uds = o.uds
	if s.uds == "" {
		s.uds = c.udsName
	}
	if c.mode.transport == "uds" {
		// What the static pod's hostPath volume (DirectoryOrCreate) does;
		// upstream proxy-server does not create it.
		if err := os.MkdirAll(filepath.Dir(s.uds), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	c.tunnelStarted = true
	argv := append(o.impl.serverArgv(), c.serverArgs(o)...)
	s.p = startProcT(t, fmt.Sprintf("%s-server-%s", o.impl, o.id), c.tp.ns(nsCP), c.logDir, argv...)
	c.waitHealthz(t, s.p, nsCP, s.healthPort)
	return s
}

// waitHTTP polls http://127.0.0.1:PORT/PATH from inside namespace role until it answers 200, and fails
// at once if p exits meanwhile.
func (c *cluster) waitHTTP(t *testing.T, p *proc, role string, port int, path string) {
	t.Helper()
	client := nsHTTPClient(c.tp.ns(role), nil, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := harness.Poll(p.Name+" "+path, 45*time.Second, 200*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) waitHealthz(t *testing.T, p *proc, role string, port int) {
	t.Helper()
	c.waitHTTP(t, p, role, port, "/healthz")
}

type agentOpts struct {
	impl        impl
	role        string // nsW1 or nsW2
	id          string
	identifiers string // --agent-identifiers
	tokenFile   string // default: a konnectivity-agent token with the right audience
	noWait      bool   // do not wait for /readyz (an agent that must be refused)
	extra       []string
}

type tunnelAgent struct {
	opts agentOpts
	p    *proc
}

// agentToken is a ServiceAccount token of kube-system/konnectivity-agent with
// the audience the servers check.
func (c *cluster) agentToken(t *testing.T) string {
	t.Helper()
	path := filepath.Join(c.dir, "agent-token")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	tok := c.kubectlT(t, "-n", "kube-system", "create", "token", "konnectivity-agent",
		"--audience=system:konnectivity-server", "--duration=2h")
	if err := os.WriteFile(path, []byte(strings.TrimSpace(tok)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// agentArgs are upstream proxy-agent flags; o.extra comes last, so it can
// override any of them (pflag keeps the last value).
func (c *cluster) agentArgs(t *testing.T, o agentOpts) []string {
	args := []string{
		"--ca-cert=" + filepath.Join(c.pki, "ca.crt"),
		"--proxy-server-host=" + cpAddr,
		fmt.Sprintf("--proxy-server-port=%d", agentPort),
		"--service-account-token-path=" + cmp.Or(o.tokenFile, c.agentToken(t)),
		"--agent-id=" + o.id,
		"--health-server-port=8093",
		"--admin-server-port=8094",
	}
	if o.identifiers != "" {
		args = append(args, "--agent-identifiers="+o.identifiers)
	}
	return append(args, o.extra...)
}

// startAgent starts an agent in its worker namespace and waits until its
// /readyz says it is connected.
func (c *cluster) startAgent(t *testing.T, o agentOpts) *tunnelAgent {
	t.Helper()
	if o.role == "" {
		o.role = nsW1
	}
	if o.id == "" {
		o.id = "agent-" + o.role
	}
	if o.role == nsW1 && o.identifiers == "" {
		o.identifiers = "ipv4=" + podAddr
	}
	argv := append(o.impl.agentArgv(), c.agentArgs(t, o)...)
	a := &tunnelAgent{opts: o}
	a.p = startProcT(t, fmt.Sprintf("%s-agent-%s", o.impl, o.id), c.tp.ns(o.role), c.logDir, argv...)
	if o.impl == implUpstream {
		// Upstream proxy-agent only drains on the first SIGTERM; it exits on a second signal.
		a.p.grace = 2 * time.Second
	}
	if !o.noWait {
		c.waitAgentReady(t, a)
	}
	return a
}

func (c *cluster) waitAgentReady(t *testing.T, a *tunnelAgent) {
	t.Helper()
	c.waitHTTP(t, a.p, a.opts.role, 8093, "/readyz")
}

// restart starts the agent again with the same arguments after it was
// stopped or killed.
func (a *tunnelAgent) restart(t *testing.T, c *cluster) {
	t.Helper()
	if a.p.Running() {
		_ = a.p.Stop(syscall.SIGTERM, 20*time.Second)
	}
	a.p = startProcT(t, a.p.Name, c.tp.ns(a.opts.role), c.logDir, a.p.Argv...)
	c.waitAgentReady(t, a)
}

// restartStopped starts a stopped or killed server again with the same
// arguments.
func (s *tunnelServer) restartStopped(t *testing.T, c *cluster) {
	t.Helper()
	if s.p.Running() {
		t.Fatalf("%s is still running", s.p.Name)
	}
	s.p = startProcT(t, s.p.Name, c.tp.ns(nsCP), c.logDir, s.p.Argv...)
	c.waitHealthz(t, s.p, nsCP, s.healthPort)
}

// agentPortSerial returns the serial number of the certificate the server
// presents on its agent port, as an agent in w1 sees it.
func (c *cluster) agentPortSerial(t *testing.T, s *tunnelServer) *big.Int {
	t.Helper()
	serial, err := c.agentPortSerialAt(net.JoinHostPort(cpAddr, strconv.Itoa(s.agentPort)))
	if err != nil {
		t.Fatal(err)
	}
	return serial
}

// agentPortSerialAt returns the serial number of the certificate that the agent port at
// addr presents to an agent in w1.
func (c *cluster) agentPortSerialAt(addr string) (*big.Int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := harness.DialIn(ctx, c.tp.ns(nsW1), addr)
	if err != nil {
		return nil, fmt.Errorf("dial agent port: %w", err)
	}
	defer raw.Close()
	// Only the presented certificate matters here, not trust.
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // reads the served certificate only
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake with agent port: %w", err)
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// expectFrontendRequiresClientCert checks that the TCP frontend refuses a
// client that trusts the server but presents no certificate: without that,
// anyone on the control-plane host could use the tunnel.
func (c *cluster) expectFrontendRequiresClientCert(t *testing.T) {
	t.Helper()
	hostPort, err := urlHostPort(c.frontendURL)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(c.pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := harness.DialIn(ctx, c.tp.ns(nsCP), hostPort)
	if err != nil {
		t.Fatalf("dial frontend %s: %v", hostPort, err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	host, _, _ := net.SplitHostPort(hostPort)
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host})
	// With TLS 1.3 the server's verdict on the client arrives after the
	// handshake, so try a whole CONNECT exchange.
	err = conn.HandshakeContext(ctx)
	if err == nil {
		_, err = fmt.Fprintf(conn, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", podAddr, podPort, podAddr, podPort)
	}
	if err == nil {
		var resp *http.Response
		resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("frontend %s answered %q to a client without a certificate", hostPort, resp.Status)
		}
	}
	// A failure on the client's side (the frontend's certificate not trusted, no TLS at all) would pass
	// the check above without the frontend having refused anything.
	var verifyErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	if errors.As(err, &verifyErr) || errors.As(err, &recordErr) {
		t.Fatalf("frontend %s: the client failed before the server could refuse it: %v", hostPort, err)
	}
	t.Logf("frontend %s refuses a client without a certificate: %v", hostPort, err)
}
