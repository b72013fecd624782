//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	corev1 "k8s.io/api/core/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// The scenarios share one cluster per egress mode; Go runs them in this
// order, so the GRPC+UDS ones come first and reuse a single kube-apiserver.

// TestGRPCOverUDS is the default deployment: kube-apiserver speaks gRPC over
// a unix socket to konnect server, agents in w1 and w2 hold tunnels, and
// sample-apiserver on w1's pod address is reachable only through them.
func TestGRPCOverUDS(t *testing.T) {
	dumpLogsOnFailure(t)
	c := sharedCluster(t, modeGRPCUDS)
	c.expectAPIServiceDown(t)
	s := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
	c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
	c.startAgent(t, agentOpts{impl: implKonnect, role: nsW2})
	c.checkChain(t)

	want := map[string][]string{"cp-0": {"agent-w1", "agent-w2"}}
	if got := c.doctorAgents(t, s.adminPort); !reflect.DeepEqual(got, want) {
		t.Fatalf("konnect doctor status: connected agents %v, want %v", got, want)
	}
	t.Logf("konnect doctor status lists agent-w1 and agent-w2 on cp-0")
}

// TestLaptop is the developer's path: kubectl in lap reaches the API server
// (which lap has no route to) through konnect socks and a real sshd in cp,
// and from there sample-apiserver through the tunnel.
func TestLaptop(t *testing.T) {
	dumpLogsOnFailure(t)
	c := sharedCluster(t, modeGRPCUDS)
	c.expectAPIServiceDown(t)
	c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
	c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.waitAPIService(ctx, "True", 90*time.Second); err != nil {
		t.Fatal(err)
	}

	apiAddr := net.JoinHostPort(cpAddr, strconv.Itoa(apiPort))
	if err := expectUnreachable(c.tp.ns(nsLap), apiAddr); err != nil {
		t.Fatal(err)
	}
	t.Logf("direct dial from lap to %s: network is unreachable", apiAddr)

	lap := c.startLaptop(t)
	c.checkFlunders(t, ctx, nsLap, lap.kubeconfig)
	t.Logf("kubectl in lap via konnect socks (proxy-url socks5://) and sshd: flunders list, create, get, delete work")

	// konnect proxy --via: kubectl proxy's job, with its own SSH connection,
	// using the plain admin kubeconfig (no proxy-url).
	proxy := startProcT(t, "konnect-proxy", c.tp.ns(nsLap), c.logDir, append(append(append(lap.env, bins.konnect, "proxy"),
		lap.sshd.sshArgs()...), "--via", cpLapAddr, "--kubeconfig", c.kubeconfig, "--port", "8001", "--health-listen", "127.0.0.1:8002")...)
	var body string
	if err := harness.Poll("curl of flunders through konnect proxy --via", 30*time.Second, 500*time.Millisecond, func() error {
		if err := proxy.Exited(); err != nil {
			return err
		}
		var err error
		body, err = harness.Run(ctx, c.tp.ns(nsLap), bins.curl, "-sS", "--fail", "--max-time", "10", "http://127.0.0.1:8001"+flundersPath)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`"kind":\s*"FlunderList"`).MatchString(body) {
		t.Fatalf("curl %s through konnect proxy: not a FlunderList: %s", flundersPath, tailString(body, 500))
	}
	if out, err := harness.Run(ctx, c.tp.ns(nsLap), bins.kubectl, "--server", "http://127.0.0.1:8001", "get", "flunders", "-n", "default"); err != nil {
		t.Fatalf("kubectl through konnect proxy: %v\n%s", err, out)
	}
	// kubectl proxy's DNS-rebinding guard: a foreign Host header is refused.
	code, err := harness.Run(ctx, c.tp.ns(nsLap), bins.curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
		"-H", "Host: evil.example", "http://127.0.0.1:8001/api")
	if err != nil {
		t.Fatal(err)
	}
	if code != "403" {
		t.Fatalf("konnect proxy with Host: evil.example: HTTP %s, want 403", code)
	}
	t.Logf("konnect proxy --via in lap: curl and kubectl list flunders; Host: evil.example is refused")

	// Its health endpoint: ready because kube-apiserver answers its /readyz over the SSH connection, and
	// /metrics counts what was served above.
	ready, err := harness.Run(ctx, c.tp.ns(nsLap), bins.curl, "-sS", "--fail", "--max-time", "10", "http://127.0.0.1:8002/readyz?verbose")
	if err != nil || !strings.Contains(ready, "[+]apiserver ok") || !strings.Contains(ready, "[+]ssh ok") {
		t.Fatalf("konnect proxy /readyz?verbose: %v\n%s", err, ready)
	}
	metrics, err := harness.Run(ctx, c.tp.ns(nsLap), bins.curl, "-sS", "--fail", "--max-time", "10", "http://127.0.0.1:8002/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`konnect_proxy_requests_total{code="200",method="GET"}`, `konnect_proxy_requests_total{code="403",method="GET"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("konnect proxy /metrics has no %s:\n%s", want, tailString(metrics, 2000))
		}
	}
	t.Logf("konnect proxy --health-listen: /readyz reports kube-apiserver and SSH ok; /metrics counts the 200s and the 403")
}

// laptop is the developer's side in lap: sshd in cp, konnect socks in lap on 127.0.0.1:1080, and the admin
// kubeconfig with proxy-url set by konnect kubeconfig set-proxy.
type laptop struct {
	sshd *sshd
	// env is a clean environment for commands in lap: no ssh-agent, no ~/.ssh of the machine's user.
	env        []string
	kubeconfig string
}

// startLaptop starts sshd and konnect socks for t and writes the developer's kubeconfig.
func (c *cluster) startLaptop(t *testing.T) laptop {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lap := laptop{sshd: c.startSSHD(t)}
	home := filepath.Join(c.dir, "lap-home-"+randHex(2))
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	lap.env = []string{"/usr/bin/env", "-u", "SSH_AUTH_SOCK", "HOME=" + home}
	socks := startProcT(t, "konnect-socks", c.tp.ns(nsLap), c.logDir, append(append(append(lap.env, bins.konnect, "socks"),
		lap.sshd.sshArgs()...), "-D", "127.0.0.1:1080", "--health-listen", "127.0.0.1:1081", cpLapAddr)...)
	client := nsHTTPClient(c.tp.ns(nsLap), nil, 3*time.Second)
	if err := harness.Poll("konnect socks /readyz", 30*time.Second, 250*time.Millisecond, func() error {
		if err := socks.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, "http://127.0.0.1:1081/readyz", nil)
	}); err != nil {
		t.Fatal(err)
	}
	lap.kubeconfig = filepath.Join(home, "kubeconfig")
	b, err := os.ReadFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lap.kubeconfig, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := harness.Run(ctx, "", bins.konnect, "kubeconfig", "set-proxy", "--kubeconfig", lap.kubeconfig,
		"--context", pkitest.KubeconfigName, "--proxy-url", "socks5://127.0.0.1:1080"); err != nil {
		t.Fatalf("konnect kubeconfig set-proxy: %v\n%s", err, out)
	}
	return lap
}

// TestFaults breaks the tunnel in the ways production does and checks that it
// heals without help.
func TestFaults(t *testing.T) {
	t.Run("agent-killed-and-restarted", func(t *testing.T) {
		dumpLogsOnFailure(t)
		c := sharedCluster(t, modeGRPCUDS)
		c.expectAPIServiceDown(t)
		c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
		a := c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
		c.checkChain(t)

		a.p.Kill()
		c.expectAPIServiceDown(t)
		if err := c.flundersWork(context.Background()); err == nil {
			t.Fatal("flunders still work with the only agent killed")
		}
		start := time.Now()
		a.restart(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.pokeUntilAvailable(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("agent restarted: APIService Available again %v after the restart", time.Since(start).Round(100*time.Millisecond))
		if err := c.flundersWork(ctx); err != nil {
			t.Fatalf("flunders after agent restart: %v", err)
		}
	})

	t.Run("server-restarted", func(t *testing.T) {
		dumpLogsOnFailure(t)
		c := sharedCluster(t, modeGRPCUDS)
		c.expectAPIServiceDown(t)
		s := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
		a := c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
		c.checkChain(t)

		// kube-apiserver keeps tunnels to sample-apiserver open; the server must
		// still stop within its graceful timeout (3 s here; ANP issue 866).
		start := time.Now()
		if err := s.p.Stop(syscall.SIGTERM, 15*time.Second); err != nil {
			t.Fatalf("konnect server on SIGTERM with tunnels open: %v", err)
		}
		t.Logf("konnect server stopped %v after SIGTERM", time.Since(start).Round(100*time.Millisecond))
		s.restartStopped(t, c)
		start = time.Now()
		c.waitAgentReady(t, a)
		if err := harness.Poll("flunders after server restart", 30*time.Second, time.Second, func() error {
			return c.flundersWork(context.Background())
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("agent reconnected and flunders work %v after the server came back", time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("two-servers", func(t *testing.T) {
		dumpLogsOnFailure(t)
		c := sharedCluster(t, modeGRPCUDS)
		c.expectAPIServiceDown(t)
		// Server A serves kube-apiserver's socket; B has its own, used through
		// konnect doctor dial the way a second control plane's kube-apiserver would.
		a := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-a", serverCount: 2})
		b := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-b", serverCount: 2, portOffset: 10,
			uds: filepath.Join(c.dir, "ks-b", "konnectivity-server.socket")})
		c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1, extra: []string{
			fmt.Sprintf("--proxy-server-host=%s:%d,%s:%d", cpAddr, a.agentPort, cpAddr, b.agentPort)}})
		both := map[string][]string{"cp-a": {"agent-w1"}, "cp-b": {"agent-w1"}}
		c.waitDoctor(t, both, a.adminPort, b.adminPort)
		c.checkChain(t)
		c.doctorDial(t, b)

		b.p.Kill()
		for i := range 5 {
			if err := c.flundersWork(context.Background()); err != nil {
				t.Fatalf("request %d after killing server B: %v", i, err)
			}
		}
		t.Logf("server B killed: 5 of 5 flunder lists through server A succeed")

		b.restartStopped(t, c)
		c.waitDoctor(t, both, a.adminPort, b.adminPort)
		a.p.Kill()
		c.doctorDial(t, b)
		t.Logf("server A killed: a dial through server B still reaches the pod address")
	})

	t.Run("certificates-renewed-on-disk", func(t *testing.T) {
		dumpLogsOnFailure(t)
		c := sharedCluster(t, modeGRPCUDS)
		c.expectAPIServiceDown(t)
		s := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
		a := c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
		c.checkChain(t)

		// A watch holds one tunnel open across the renewal.
		watch := startProcT(t, "kubectl-watch", c.tp.ns(nsCP), c.logDir, bins.kubectl, "--kubeconfig", c.kubeconfig,
			"get", "flunders", "-n", "default", "--watch", "-o", "name")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		seen := func(name string) error {
			return harness.Poll("the watch to print "+name, 20*time.Second, 250*time.Millisecond, func() error {
				if err := watch.Exited(); err != nil {
					return err
				}
				if !strings.Contains(watch.Log(), "flunder.wardle.example.com/"+name) {
					return errNotYet
				}
				return nil
			})
		}
		createFlunder := func(name string) {
			t.Helper()
			if err := c.applyYAML(ctx, fmt.Sprintf("apiVersion: wardle.example.com/v1alpha1\nkind: Flunder\nmetadata:\n  name: %s\n  namespace: default\nspec: {}\n", name)); err != nil {
				t.Fatalf("create flunder %s: %v", name, err)
			}
			t.Cleanup(func() {
				_, _ = c.kubectl(context.Background(), nsCP, "delete", "--ignore-not-found", "flunder", "-n", "default", name)
			})
		}
		pre := "before-" + randHex(3)
		createFlunder(pre)
		if err := seen(pre); err != nil {
			t.Fatal(err)
		}
		before := c.agentPortSerial(t, s)
		if out, err := harness.Run(ctx, "", bins.konnect, "certs", "renew", "konnectivity-server", "--dir", c.konnectDir); err != nil {
			t.Fatalf("konnect certs renew: %v\n%s", err, out)
		}
		onDisk, err := pkitest.Load(filepath.Join(c.pki, "konnectivity-server.crt"), filepath.Join(c.pki, "konnectivity-server.key"))
		if err != nil {
			t.Fatal(err)
		}
		if onDisk.Cert.SerialNumber.Cmp(before) == 0 {
			t.Fatal("konnect certs renew did not change the certificate")
		}
		if err := harness.Poll("server to serve the renewed certificate", 30*time.Second, 500*time.Millisecond, func() error {
			if got := c.agentPortSerial(t, s); got.Cmp(onDisk.Cert.SerialNumber) != 0 {
				return fmt.Errorf("serving serial %x, on disk %x", got, onDisk.Cert.SerialNumber)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !s.p.Running() || !a.p.Running() {
			t.Fatal("a tunnel process exited during the renewal")
		}
		post := "after-" + randHex(3)
		createFlunder(post)
		if err := seen(post); err != nil {
			t.Fatalf("the watch opened before the renewal: %v", err)
		}
		t.Logf("renewed konnectivity-server cert served without restart; a watch opened before still streams; flunders work")
	})
}

// TestAgentAuthentication checks the server's TokenReview against the real
// kube-apiserver: a token with the wrong audience, and a token of another
// ServiceAccount, are refused, while the right one is accepted.
func TestAgentAuthentication(t *testing.T) {
	dumpLogsOnFailure(t)
	c := sharedCluster(t, modeGRPCUDS)
	c.expectAPIServiceDown(t)
	s := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const intruder = "e2e-intruder"
	if _, err := c.kubectl(ctx, nsCP, "-n", "kube-system", "get", "serviceaccount", intruder); err != nil {
		c.kubectlT(t, "-n", "kube-system", "create", "serviceaccount", intruder)
	}
	token := func(sa, audience string) string {
		out := c.kubectlT(t, "-n", "kube-system", "create", "token", sa, "--audience="+audience)
		path := filepath.Join(c.dir, "token-"+randHex(3))
		if err := os.WriteFile(path, []byte(strings.TrimSpace(out)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	refused := []*tunnelAgent{
		c.startAgent(t, agentOpts{impl: implKonnect, role: nsW2, id: "agent-wrong-audience", noWait: true,
			tokenFile: token("konnectivity-agent", "https://kubernetes.default.svc"),
			extra:     []string{"--health-server-port=8193", "--admin-server-port=8194"}}),
		c.startAgent(t, agentOpts{impl: implKonnect, role: nsW2, id: "agent-wrong-account", noWait: true,
			tokenFile: token(intruder, "system:konnectivity-server"),
			extra:     []string{"--health-server-port=8293", "--admin-server-port=8294"}}),
	}
	c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})

	// The refused agents keep retrying; each attempt must fail and be
	// reported by konnect doctor status as that agent's last error.
	err := harness.Poll("konnect doctor status to report the refused agents", 30*time.Second, time.Second, func() error {
		agents := c.doctorStatus(t, s.adminPort)["cp-0"]
		for _, a := range refused {
			st, ok := agents[a.opts.id]
			switch {
			case !ok:
				return fmt.Errorf("%s not listed: %+v", a.opts.id, agents)
			case st.Connected:
				return fmt.Errorf("%s is connected with a bad token", a.opts.id)
			case st.LastError == "":
				return fmt.Errorf("%s has no last error", a.opts.id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range refused {
		if err := a.p.Exited(); err != nil {
			t.Fatalf("a refused agent should keep retrying: %v", err)
		}
		t.Logf("%s refused: %s", a.opts.id, c.doctorStatus(t, s.adminPort)["cp-0"][a.opts.id].LastError)
	}
	if got, want := c.doctorAgents(t, s.adminPort), map[string][]string{"cp-0": {"agent-w1"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("connected agents %v, want %v", got, want)
	}
	c.checkChain(t)
}

// TestAgentMTLS authenticates agents by client certificate instead of a
// token: konnect init issues konnectivity-agent.{crt,key} from the agents' own CA
// (--agent-auth mtls), the server checks it with --cluster-ca-cert, and an
// agent that has only a token is refused. Both konnect and upstream agents
// are used.
func TestAgentMTLS(t *testing.T) {
	dumpLogsOnFailure(t) // once, for the subtests too: they share this cluster
	c := sharedCluster(t, modeGRPCUDS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := harness.Run(ctx, "", bins.konnect, "init", "phase", "certs", "--dir", c.konnectDir,
		"--control-plane-address", cpAddr, "--agent-auth", "mtls"); err != nil {
		t.Fatalf("konnect init phase certs --agent-auth mtls: %v\n%s", err, out)
	}
	certOnly := []string{
		// No token authentication: every flag of it emptied (pflag keeps the last value).
		"--agent-namespace=", "--agent-service-account=", "--authentication-audience=", "--kubeconfig=",
		"--cluster-ca-cert=" + filepath.Join(c.pki, "konnectivity-agent-ca.crt"),
		// As konnect init renders it.
		"--cluster-allowed-names=konnectivity-agent",
	}
	agentCert := []string{
		"--service-account-token-path=",
		"--agent-cert=" + filepath.Join(c.pki, "konnectivity-agent.crt"),
		"--agent-key=" + filepath.Join(c.pki, "konnectivity-agent.key"),
	}
	// The agents' certificate is for the server alone: kube-apiserver, which trusts the cluster CA, refuses it.
	agentKubeconfig := filepath.Join(c.dir, "agent-cert.kubeconfig")
	caPEM, err := os.ReadFile(filepath.Join(c.pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pkitest.WriteKubeconfig(agentKubeconfig, clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:%d", cpAddr, apiPort), CertificateAuthorityData: caPEM},
		clientcmdapi.AuthInfo{ClientCertificate: filepath.Join(c.pki, "konnectivity-agent.crt"), ClientKey: filepath.Join(c.pki, "konnectivity-agent.key")}); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.Run(ctx, c.tp.ns(nsCP), bins.kubectl, "--kubeconfig", agentKubeconfig, "get", "--raw", "/api"); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("kube-apiserver takes the agents' client certificate: %v", err)
	}
	for _, agent := range []impl{implKonnect, implUpstream} {
		t.Run("konnect-server+"+string(agent)+"-agent", func(t *testing.T) {
			c.expectAPIServiceDown(t)
			s := c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0", extra: certOnly})
			// A token alone is not enough for this server, nor a certificate of the cluster CA (the harness's
			// admin, which kube-apiserver takes).
			tokenOnly := c.startAgent(t, agentOpts{impl: implKonnect, role: nsW2, noWait: true})
			c.startAgent(t, agentOpts{impl: agent, role: nsW2, id: "impostor-w2", noWait: true, extra: []string{
				"--service-account-token-path=", "--health-server-port=8095", "--admin-server-port=8096",
				"--agent-cert=" + filepath.Join(c.dir, "harness", "admin.crt"), "--agent-key=" + filepath.Join(c.dir, "harness", "admin.key")}})
			c.startAgent(t, agentOpts{impl: agent, role: nsW1, extra: agentCert})
			c.checkChain(t)
			if got, want := c.doctorAgents(t, s.adminPort), map[string][]string{"cp-0": {"agent-w1"}}; !reflect.DeepEqual(got, want) {
				t.Fatalf("connected agents %v, want %v (the token-only agent and the impostor must be refused)", got, want)
			}
			if err := tokenOnly.p.Exited(); err != nil {
				t.Fatalf("the refused agent should keep retrying: %v", err)
			}
			w2 := nsHTTPClient(c.tp.ns(nsW2), nil, 3*time.Second)
			// Its health server must answer first: a refused connection would make the /readyz check pass
			// without saying anything.
			if err := harness.Poll("the token-only agent's /livez", 30*time.Second, 250*time.Millisecond, func() error {
				if err := tokenOnly.p.Exited(); err != nil {
					return err
				}
				return httpGetOK(ctx, w2, "http://127.0.0.1:8093/livez", nil)
			}); err != nil {
				t.Fatal(err)
			}
			if err := httpGetOK(ctx, w2, "http://127.0.0.1:8093/readyz", nil); err == nil {
				t.Fatal("the token-only agent reports ready against a client-certificate server")
			}
			t.Logf("client-certificate agent serves the chain; a token-only agent is refused")
		})
	}
}

// TestWireCompatibility runs the chain with upstream and konnect ends mixed.
// The upstream pair is the control: it shows the harness itself is sound.
func TestWireCompatibility(t *testing.T) {
	for _, tc := range []struct {
		name          string
		server, agent impl
	}{
		{"upstream-server+upstream-agent", implUpstream, implUpstream},
		{"konnect-server+upstream-agent", implKonnect, implUpstream},
		{"upstream-server+konnect-agent", implUpstream, implKonnect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dumpLogsOnFailure(t)
			c := sharedCluster(t, modeGRPCUDS)
			c.expectAPIServiceDown(t)
			c.startServer(t, serverOpts{impl: tc.server})
			c.startAgent(t, agentOpts{impl: tc.agent, role: nsW1})
			c.checkChain(t)
		})
	}
}

// TestManifests checks what konnect init writes for a real cluster: the API
// server accepts every manifest in a server-side dry run, the ServiceAccount
// and RBAC (which every other scenario runs on) are in place, and the
// server's static pod arguments, run as they are, serve the chain.
func TestManifests(t *testing.T) {
	dumpLogsOnFailure(t)
	c := sharedCluster(t, modeGRPCUDS)
	c.expectAPIServiceDown(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Server-side dry run of everything: a directory with a kustomization.yaml
	// is applied with -k, any other YAML file with -f.
	var applied []string
	for _, root := range c.manifestRoots() {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if _, err := os.Stat(filepath.Join(path, "kustomization.yaml")); err == nil {
					if out, err := c.kubectl(ctx, nsCP, "apply", "--dry-run=server", "-k", path); err != nil {
						return fmt.Errorf("dry run of kustomization %s: %w\n%s", path, err, out)
					}
					applied = append(applied, "-k "+path)
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".yaml") {
				return nil
			}
			if out, err := c.kubectl(ctx, nsCP, "apply", "--dry-run=server", "-f", path); err != nil {
				return fmt.Errorf("dry run of %s: %w\n%s", path, err, out)
			}
			applied = append(applied, "-f "+path)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("kubectl apply --dry-run=server accepted: %s", strings.Join(applied, "; "))

	docs, err := c.konnectManifests()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, d := range docs {
		kinds[d.kind] = true
	}
	for _, k := range []string{"Pod", "DaemonSet", "ServiceAccount", "ClusterRoleBinding"} {
		if !kinds[k] {
			t.Errorf("konnect init wrote no %s under %s", k, c.manifestRoots())
		}
	}

	// The ServiceAccount and RBAC were applied at cluster start; applying them
	// again changes nothing, and they grant what the server needs.
	rbac, picked, err := c.konnectRBACFile()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.kubectl(ctx, nsCP, "apply", "-f", rbac)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range picked {
		if !strings.Contains(out, "/"+d.name+" unchanged") {
			t.Errorf("second apply of konnect's %s %s: want unchanged, got:\n%s", d.kind, d.name, out)
		}
	}
	if out, err := c.kubectl(ctx, nsCP, "auth", "can-i", "create", "tokenreviews.authentication.k8s.io", "--as=system:konnectivity-server"); err != nil || strings.TrimSpace(out) != "yes" {
		t.Fatalf("system:konnectivity-server may not create TokenReviews: %q %v", out, err)
	}
	// It reads the Node a TokenReview names, to check the agent's identifiers, and may list none.
	if out, err := c.kubectl(ctx, nsCP, "auth", "can-i", "get", "nodes", "--as=system:konnectivity-server"); err != nil || strings.TrimSpace(out) != "yes" {
		t.Fatalf("system:konnectivity-server may not get Nodes: %q %v", out, err)
	}
	if out, _ := c.kubectl(ctx, nsCP, "auth", "can-i", "list", "nodes", "--as=system:konnectivity-server"); strings.TrimSpace(out) != "no" {
		t.Fatalf("system:konnectivity-server may list Nodes: %q", out)
	}
	// Least privilege: TokenReviews only, no SubjectAccessReviews (system:auth-delegator would grant them).
	if out, _ := c.kubectl(ctx, nsCP, "auth", "can-i", "create", "subjectaccessreviews.authorization.k8s.io", "--as=system:konnectivity-server"); strings.TrimSpace(out) != "no" {
		t.Fatalf("system:konnectivity-server may create SubjectAccessReviews: %q", out)
	}
	c.kubectlT(t, "-n", "kube-system", "get", "serviceaccount", "konnectivity-agent")
	// An agent's token is for the server alone: the server's TokenReviews name its audience, and
	// kube-apiserver, whose --api-audiences konnect leaves alone, refuses it for its own API.
	if out, err := harness.Run(ctx, c.tp.ns(nsCP), bins.kubectl, "--kubeconfig", c.agentKubeconfig(t, konnectivity.Audience), "get", "--raw", "/api"); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("kube-apiserver takes an agent's token (audience %s) for its own API: %v\n%s", konnectivity.Audience, err, out)
	}

	// Run konnect server exactly as the static pod would.
	var pod corev1.Pod
	for _, d := range docs {
		if d.kind == "Pod" {
			if err := yaml.UnmarshalStrict(d.raw, &pod); err != nil {
				t.Fatalf("%s: %v", d.file, err)
			}
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("static pod has %d containers, want 1", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	if len(ctr.Command) != 1 || filepath.Base(ctr.Command[0]) != "konnect" {
		t.Fatalf("static pod command %q, want konnect", ctr.Command)
	}
	health := 0
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--health-port="); ok {
			health, _ = strconv.Atoi(v)
		}
	}
	if health == 0 || ctr.LivenessProbe == nil || ctr.LivenessProbe.HTTPGet == nil || ctr.LivenessProbe.HTTPGet.Port.IntValue() != health {
		t.Fatalf("static pod: liveness probe does not point at --health-port=%d", health)
	}
	p := startProcT(t, "konnect-server-static-pod", c.tp.ns(nsCP), c.logDir, append([]string{bins.konnect}, ctr.Args...)...)
	c.tunnelStarted = true
	for _, probe := range []*corev1.Probe{ctr.LivenessProbe, ctr.ReadinessProbe, ctr.StartupProbe} {
		if probe == nil || probe.HTTPGet == nil {
			continue
		}
		u := fmt.Sprintf("http://127.0.0.1:%d%s", probe.HTTPGet.Port.IntValue(), probe.HTTPGet.Path)
		client := nsHTTPClient(c.tp.ns(nsCP), nil, 2*time.Second)
		if err := harness.Poll("static pod probe "+u, 30*time.Second, 250*time.Millisecond, func() error {
			if err := p.Exited(); err != nil {
				return err
			}
			return httpGetOK(ctx, client, u, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("konnect server with the static pod's arguments passes the pod's probes")
	c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1})
	c.checkChain(t)
}

// TestHTTPConnect runs the chain with kube-apiserver speaking HTTP CONNECT to
// the server: over a unix socket, and over TCP with mutual TLS (the
// frontend certificate and kube-apiserver's client certificate come from
// konnect init). Each needs its own kube-apiserver, since the egress
// configuration is read at start-up. Mixed konnect/upstream pairs run in
// this mode too.
func TestHTTPConnect(t *testing.T) {
	for _, tc := range []struct {
		name          string
		mode          egressMode
		server, agent impl
	}{
		{"uds", modeHTTPConnectUDS, implKonnect, implKonnect},
		{"uds/konnect-server+upstream-agent", modeHTTPConnectUDS, implKonnect, implUpstream},
		{"uds/upstream-server+konnect-agent", modeHTTPConnectUDS, implUpstream, implKonnect},
		{"tcp-mtls", modeHTTPConnectTCP, implKonnect, implKonnect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dumpLogsOnFailure(t)
			c := sharedCluster(t, tc.mode)
			c.expectAPIServiceDown(t)
			s := c.startServer(t, serverOpts{impl: tc.server, id: "cp-0"})
			c.startAgent(t, agentOpts{impl: tc.agent, role: nsW1})
			c.startAgent(t, agentOpts{impl: tc.agent, role: nsW2})
			c.checkChain(t)
			if tc.server == implKonnect {
				want := map[string][]string{"cp-0": {"agent-w1", "agent-w2"}}
				if got := c.doctorAgents(t, s.adminPort); !reflect.DeepEqual(got, want) {
					t.Fatalf("konnect doctor status: connected agents %v, want %v", got, want)
				}
				t.Logf("konnect doctor status lists both agents")
				if tc.mode.transport == "uds" {
					c.doctorDial(t, s)
					t.Logf("konnect doctor dial through the socket reaches the pod address")
				}
			}
			if tc.mode.transport == "tcp" {
				c.expectFrontendRequiresClientCert(t)
			}
		})
	}
}
