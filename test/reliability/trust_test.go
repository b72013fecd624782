//go:build integration

package reliability

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
)

// connectedAgents asks the server's admin port which agents are connected.
func connectedAgents(adminPort int) ([]string, error) {
	all, err := listedAgents(adminPort)
	if err != nil {
		return nil, err
	}
	var ids []string
	for id, connected := range all {
		if connected {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// listedAgents is every agent the server's status lists, connected or not, by ID.
func listedAgents(adminPort int) (map[string]bool, error) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/agents", adminPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st struct {
		Agents []struct {
			ID        string `json:"id"`
			Connected bool   `json:"connected"`
		} `json:"agents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	all := map[string]bool{}
	for _, a := range st.Agents {
		all[a.ID] = a.Connected
	}
	return all, nil
}

// rejectWindow is how long an agent that must be rejected is watched.
const rejectWindow = 6 * time.Second

// expectRejected watches an agent until deadline: it keeps running (retrying), never becomes ready,
// and the server never lists it as connected.
func expectRejected(t *testing.T, server *harness.Proc, adminPort int, agent *harness.Proc, agentHealth int, agentID string, deadline time.Time) {
	t.Helper()
	for first := true; first || time.Now().Before(deadline); first = false {
		if !agent.Running() {
			code, _ := agent.Wait(time.Second)
			t.Fatalf("the agent exited (code %d) instead of being rejected by the server; its log:\n%s", code, harness.Tail(agent.Log(), 3000))
		}
		if ids, err := connectedAgents(adminPort); err != nil {
			t.Fatalf("server status: %v", err)
		} else {
			for _, id := range ids {
				if id == agentID {
					t.Fatalf("the server accepted agent %s", agentID)
				}
			}
		}
		if httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", agentHealth)) == nil {
			t.Fatalf("the agent became ready")
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("agent's last log lines:\n%s", agent.LogTail(2))
}

// expectConnected waits until the server lists the agent as connected.
func expectConnected(t *testing.T, adminPort int, agent *harness.Proc, agentID string) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, "agent "+agentID+" connected", func() error {
		if !agent.Running() {
			t.Fatalf("the agent exited; its log:\n%s", harness.Tail(agent.Log(), 3000))
		}
		ids, err := connectedAgents(adminPort)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if id == agentID {
				return nil
			}
		}
		return fmt.Errorf("connected: %v", ids)
	})
}

// noSecretsIn fails if any secret appears in any of the logs.
func noSecretsIn(t *testing.T, secrets map[string]string, procs ...*harness.Proc) {
	t.Helper()
	for _, p := range procs {
		logs := p.Log()
		for what, s := range secrets {
			if s != "" && strings.Contains(logs, s) {
				i := strings.Index(logs, s)
				line := logs[strings.LastIndex(logs[:i], "\n")+1:]
				if j := strings.IndexByte(line, '\n'); j >= 0 {
					line = line[:j]
				}
				t.Errorf("%s appears in the log of %s: %s", what, p.Name, harness.Tail(line, 300))
			}
		}
	}
}

// TestAgentAuthentication starts a server that authenticates agents by ServiceAccount token (TokenReview
// against a fake API server) and one that authenticates by client certificate, and agents (at -v=10) with
// no credentials, an unknown token, a token for the wrong audience, an expired token, a token of another
// service account, and a certificate from another CA. Each is rejected, and no token appears in any log.
// Good credentials connect, so that the rejections mean something.
func TestAgentAuthentication(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	dir := copyBase(t)
	tr := newTokenReviewer(t)
	kubeconfig := tr.kubeconfig(t, dir)
	ports := harness.FreePorts(t, 6)
	tokSrv := serverPorts{ports[0], ports[1], ports[2]}
	certSrv := serverPorts{ports[3], ports[4], ports[5]}
	sockDir := shortDir(t)
	tokenServer := startKonnect(t, "token-server", serverArgs(dir, filepath.Join(sockDir, "t.sock"), tokSrv, append(tokenServerArgs(kubeconfig), "-v", "10")...)...)
	certServer := startKonnect(t, "cert-server", serverArgs(dir, filepath.Join(sockDir, "c.sock"), certSrv, append(mtlsServer(dir), "-v", "10")...)...)
	waitReady(t, tokenServer, tokSrv.health)
	waitReady(t, certServer, certSrv.health)

	sa := "system:serviceaccount:" + agentNamespace + ":" + agentSA
	tokens := map[string]fakeToken{
		"wrong-audience":        {user: sa, audiences: []string{"https://kubernetes.default.svc"}},
		"expired":               {user: sa, audiences: []string{agentAudience}, expired: true},
		"other-service-account": {user: "system:serviceaccount:default:default", audiences: []string{agentAudience}},
	}
	secrets := map[string]string{}
	for name, ft := range tokens {
		tok := "tok-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		tr.add(tok, ft)
		secrets["token "+name] = tok
	}
	secrets["token unknown"] = "tok-unknown-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	good := tr.goodAgentToken()
	secrets["token good"] = good
	secrets["server kubeconfig token"] = "konnectivity-server-token-0123456789"

	// A client certificate for the agent from a CA the server does not trust.
	otherDir := shortDir(t)
	ca := pkitest.NewCA(t, "someone-elses-ca")
	agentCert := mustParseCert(t, filepath.Join(dir, "pki", "konnectivity-agent.crt"))
	signLeaf(t, filepath.Join(otherDir, "agent.crt"), agentCert, agentCert.PublicKey, ca.Cert, ca.Key, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	copyFile(t, filepath.Join(dir, "pki", "konnectivity-agent.key"), filepath.Join(otherDir, "agent.key"))

	var all []*harness.Proc
	startAgent := func(t *testing.T, id string, sp serverPorts, creds ...string) (*harness.Proc, int) {
		t.Helper()
		ap := harness.FreePorts(t, 2)
		args := agentArgs(dir, []int{sp.agent}, ap[0], ap[1], append(creds, "--agent-id", id, "-v", "10")...)
		p := startKonnect(t, id, args...)
		all = append(all, p)
		return p, ap[1]
	}
	tokenFile := func(t *testing.T, tok string) string {
		path := filepath.Join(shortDir(t), "token")
		writeFile(t, path, tok)
		return path
	}
	cases := []struct {
		name   string
		server serverPorts
		srv    *harness.Proc
		creds  func(t *testing.T) []string
		accept bool
	}{
		{"good-token", tokSrv, tokenServer, func(t *testing.T) []string {
			return []string{"--service-account-token-path", tokenFile(t, good)}
		}, true},
		{"no-token", tokSrv, tokenServer, func(t *testing.T) []string { return nil }, false},
		{"unknown-token", tokSrv, tokenServer, func(t *testing.T) []string {
			return []string{"--service-account-token-path", tokenFile(t, secrets["token unknown"])}
		}, false},
		{"wrong-audience", tokSrv, tokenServer, func(t *testing.T) []string {
			return []string{"--service-account-token-path", tokenFile(t, secrets["token wrong-audience"])}
		}, false},
		{"expired-token", tokSrv, tokenServer, func(t *testing.T) []string {
			return []string{"--service-account-token-path", tokenFile(t, secrets["token expired"])}
		}, false},
		{"other-service-account", tokSrv, tokenServer, func(t *testing.T) []string {
			return []string{"--service-account-token-path", tokenFile(t, secrets["token other-service-account"])}
		}, false},
		{"good-cert", certSrv, certServer, func(t *testing.T) []string { return mtlsAgent(dir) }, true},
		{"cert-from-other-ca", certSrv, certServer, func(t *testing.T) []string {
			return []string{"--agent-cert", filepath.Join(otherDir, "agent.crt"), "--agent-key", filepath.Join(otherDir, "agent.key")}
		}, false},
	}
	// Every agent starts at once, and each is watched until the same deadline.
	type started struct {
		p      *harness.Proc
		health int
	}
	agents := make([]started, len(cases))
	for i, tc := range cases {
		agents[i].p, agents[i].health = startAgent(t, "agent-"+tc.name, tc.server, tc.creds(t)...)
	}
	deadline := time.Now().Add(rejectWindow)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := "agent-" + tc.name
			if tc.accept {
				expectConnected(t, tc.server.admin, agents[i].p, id)
				return
			}
			expectRejected(t, tc.srv, tc.server.admin, agents[i].p, agents[i].health, id, deadline)
		})
	}
	noSecretsIn(t, secrets, append(all, tokenServer, certServer)...)
	if !strings.Contains(strings.ToLower(tokenServer.Log()), "authenticat") {
		t.Errorf("the token server's log says nothing about failed authentication:\n%s", harness.Tail(tokenServer.Log(), 2000))
	}
}

// TestServerCertificateSAN gives the server a certificate (signed by the right CA) whose SANs do not
// include the address the agent dials. The agent refuses the connection.
func TestServerCertificateSAN(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	dir := copyBase(t)
	pki := filepath.Join(dir, "pki")
	leaf := mustParseCert(t, filepath.Join(pki, "konnectivity-server.crt"))
	leaf.DNSNames, leaf.IPAddresses = []string{"wrong.example"}, nil
	signLeaf(t, filepath.Join(pki, "konnectivity-server.crt"), leaf, leaf.PublicKey,
		mustParseCert(t, filepath.Join(pki, "ca.crt")), mustParseKey(t, filepath.Join(pki, "ca.key")), time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	tr := newTokenReviewer(t)
	ports := harness.FreePorts(t, 5)
	sp := serverPorts{ports[0], ports[1], ports[2]}
	server := startKonnect(t, "server", serverArgs(dir, filepath.Join(shortDir(t), "s.sock"), sp, tokenServerArgs(tr.kubeconfig(t, dir))...)...)
	waitReady(t, server, sp.health)
	tok := tr.goodAgentToken()
	writeFile(t, filepath.Join(dir, "agent-token"), tok)
	agent := startKonnect(t, "agent", agentArgs(dir, []int{sp.agent}, ports[3], ports[4],
		"--service-account-token-path", filepath.Join(dir, "agent-token"), "--agent-id", "san-agent", "-v", "10")...)
	expectRejected(t, server, sp.admin, agent, ports[4], "san-agent", time.Now().Add(rejectWindow))
	if l := agent.Log(); !strings.Contains(l, "certificate") {
		t.Errorf("the agent's log does not say why (certificate):\n%s", harness.Tail(l, 2000))
	}
	noSecretsIn(t, map[string]string{"agent token": tok}, agent, server)
}

// TestRemoteBindRefused asks every listener that may expose credentials or pprof for a non-loopback
// address without --allow-remote. Each is refused at start, naming the flag.
func TestRemoteBindRefused(t *testing.T) {
	dir := copyBase(t)
	kc := filepath.Join(shortDir(t), "kubeconfig")
	writeFile(t, kc, testKubeconfig)
	uds := filepath.Join(shortDir(t), "s.sock")
	ports := harness.FreePorts(t, 4)
	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"socks-listen", []string{"socks", "-F", "none", "--known-hosts", filepath.Join(dir, "kh"), "-D", "0.0.0.0:" + strconv.Itoa(ports[0]), "127.0.0.1"}, "-D"},
		{"socks-http-listen", []string{"socks", "-F", "none", "--known-hosts", filepath.Join(dir, "kh"), "-D", "127.0.0.1:" + strconv.Itoa(ports[0]), "--http-listen", "0.0.0.0:" + strconv.Itoa(ports[1]), "127.0.0.1"}, "--http-listen"},
		{"socks-health-listen", []string{"socks", "-F", "none", "--known-hosts", filepath.Join(dir, "kh"), "-D", "127.0.0.1:" + strconv.Itoa(ports[0]), "--health-listen", "0.0.0.0:" + strconv.Itoa(ports[1]), "127.0.0.1"}, "--health-listen"},
		{"proxy-address", []string{"proxy", "--kubeconfig", kc, "--address", "0.0.0.0", "--port", strconv.Itoa(ports[0])}, "--address"},
		{"proxy-health-listen", []string{"proxy", "--kubeconfig", kc, "--port", strconv.Itoa(ports[0]), "--health-listen", "0.0.0.0:" + strconv.Itoa(ports[1])}, "--health-listen"},
		{"server-admin", serverArgs(dir, uds, serverPorts{ports[0], ports[1], ports[2]}, append(mtlsServer(dir), "--admin-bind-address", "0.0.0.0")...), "--admin-bind-address"},
		{"agent-admin", agentArgs(dir, []int{ports[0]}, ports[1], ports[2], append(mtlsAgent(dir), "--admin-bind-address", "0.0.0.0")...), "--admin-bind-address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := konnect(t, 30*time.Second, tc.args...)
			t.Logf("exit %d: %s", r.code, strings.TrimSpace(r.stderr))
			checkRefused(t, r, []string{tc.flag, "0.0.0.0"}, "")
			if !strings.Contains(r.stderr, "loopback") {
				t.Errorf("the error does not say that the address is not loopback:\n%s", r.stderr)
			}
		})
	}
}

// TestProxyHostHeader sends konnect proxy requests with Host headers it must not accept (DNS rebinding):
// 403, and the API server never sees them; localhost and 127.0.0.1 are served. A blank Host header reaches
// the filter and gets its 403; a request with no Host line at all is refused with 400 before it, by Go's
// HTTP server (HTTP/1.1 requires the header), and an HTTP/1.0 request without one is the filter's 403.
// Requests are written byte for byte: Go's client would not send some of these heads.
func TestProxyHostHeader(t *testing.T) {
	tr := newTokenReviewer(t)
	px := startProxy(t, tr)
	for i, tc := range []struct {
		name  string
		proto string
		host  string // the Host line, without its CRLF; "" for none
		want  int
	}{
		{"localhost", "HTTP/1.1", "Host: localhost", http.StatusOK},
		{"127.0.0.1", "HTTP/1.1", "Host: 127.0.0.1", http.StatusOK},
		{"evil.example", "HTTP/1.1", "Host: evil.example", http.StatusForbidden},
		{"localhost.evil.example", "HTTP/1.1", "Host: localhost.evil.example", http.StatusForbidden},
		{"127.0.0.1.nip.io", "HTTP/1.1", "Host: 127.0.0.1.nip.io", http.StatusForbidden},
		{"blank", "HTTP/1.1", "Host:", http.StatusForbidden},
		{"blank-spaces", "HTTP/1.1", "Host:   ", http.StatusForbidden},
		{"missing", "HTTP/1.1", "", http.StatusBadRequest},
		{"missing-http1.0", "HTTP/1.0", "", http.StatusForbidden},
	} {
		t.Run("host="+tc.name, func(t *testing.T) {
			path := fmt.Sprintf("/api/host-header-case-%d", i)
			head := "GET " + path + " " + tc.proto + "\r\n"
			if tc.host != "" {
				head += tc.host + "\r\n"
			}
			head += "Connection: close\r\n\r\n"
			status, body, err := rawHTTP(px.addr, head)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.want {
				t.Errorf("%q: %d %q, want %d", head, status, body, tc.want)
			}
			served := 0
			if tc.want == http.StatusOK {
				served = 1
			}
			if n := tr.requests(path); n != served {
				t.Errorf("%q: the API server saw %d requests, want %d", head, n, served)
			}
			t.Logf("%d %s", status, strings.Join(strings.Fields(body), " "))
		})
	}
	noSecretsIn(t, map[string]string{"kubeconfig token": proxyToken}, px.p)
}

// rawHTTP writes head to addr as it is and returns the status code and the start of the body of the answer.
func rawHTTP(addr, head string) (int, string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, string(body), nil
}

// TestSSHHostKey points konnect socks at a real sshd whose host key is unknown, and at one whose key
// changed. Neither connects: the proxy is never ready, requests through it fail, and the log says why
// (the fingerprint for an unknown host; a loud refusal for a changed key).
func TestSSHHostKey(t *testing.T) {
	t.Parallel() // waits on timeouts; runs alongside the other waiting tests, after the soak
	s := startSSHD(t)
	b := startBackend(t)
	_, otherPub := harness.SSHKeyPair(t, shortDir(t), "other_key", "")
	otherPub = strings.Join(strings.Fields(otherPub)[:2], " ") // without the comment
	for _, tc := range []struct {
		name       string
		knownHosts string
		want       []string
	}{
		{"unknown", "", []string{"SHA256:"}},
		{"changed", fmt.Sprintf("[127.0.0.1]:%d %s", s.port, otherPub), []string{"changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kh := filepath.Join(shortDir(t), "known_hosts")
			writeFile(t, kh, tc.knownHosts)
			before := snapshot(t, filepath.Dir(kh))
			ports := harness.FreePorts(t, 2)
			addr := "127.0.0.1:" + strconv.Itoa(ports[0])
			args := []string{"socks", "-F", "none", "--known-hosts", kh, "-i", s.clientKey, "-p", strconv.Itoa(s.port), "-l", "root",
				"-D", addr, "--health-listen", "127.0.0.1:" + strconv.Itoa(ports[1]), "--connect-timeout", "3s", "127.0.0.1"}
			p := startKonnect(t, "socks", args...)
			deadline := time.Now().Add(rejectWindow)
			for time.Now().Before(deadline) {
				if httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])) == nil {
					t.Fatalf("socks became ready with an %s host key", tc.name)
				}
				time.Sleep(250 * time.Millisecond)
			}
			if p.Running() {
				if err := socksGet(addr, b.addr); err == nil {
					t.Errorf("a request went through with an %s host key", tc.name)
				}
			}
			if n := b.accepted.Load(); n != 0 {
				t.Errorf("the backend was reached %d times", n)
			}
			for _, w := range tc.want {
				if !strings.Contains(p.Log(), w) {
					t.Errorf("the log does not say %q:\n%s", w, harness.Tail(p.Log(), 2000))
				}
			}
			if d := diffSnapshots(before, snapshot(t, filepath.Dir(kh))); len(d) > 0 {
				t.Errorf("known_hosts changed without --accept-new: %v", d)
			}
			t.Logf("log:\n%s", p.LogTail(3))
		})
	}
}
