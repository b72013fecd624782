//go:build integration

package reliability

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// keyChunks returns, for every PEM private key file given, a few distinctive lines of its body: any of
// them in a log means key material leaked.
func keyChunks(t *testing.T, files ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var body []string
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" && !strings.HasPrefix(l, "-----") {
				body = append(body, l)
			}
		}
		for i, l := range body {
			if len(l) >= 40 && (i == 1 || i == len(body)/2) {
				out[fmt.Sprintf("key %s line %d", filepath.Base(f), i)] = l[:40]
			}
		}
	}
	return out
}

// pkiKeys lists the private key files under dir/pki.
func pkiKeys(t *testing.T, dir string) []string {
	keys, err := filepath.Glob(filepath.Join(dir, "pki", "*.key"))
	if err != nil || len(keys) == 0 {
		t.Fatalf("no keys under %s/pki: %v", dir, err)
	}
	return keys
}

// TestSecretsNotLogged runs every daemon at -v=10 (server and agent with a token, socks through a real
// sshd with a key file, proxy with a token in its kubeconfig), pushes traffic through each, and greps
// every log for the private keys' bodies and the tokens.
func TestSecretsNotLogged(t *testing.T) {
	v := "10"
	if e := os.Getenv("KONNECT_RELIABILITY_V"); e != "" {
		v = e // to find the lowest verbosity that leaks
	}
	dir := copyBase(t)
	tr := newTokenReviewer(t)
	tokenPath := filepath.Join(dir, "agent-token")
	agentToken := tr.goodAgentToken()
	writeFile(t, tokenPath, agentToken)
	b := startBackend(t)
	tn := startTunnel(t, dir, append(tokenServerArgs(tr.kubeconfig(t, dir)), "-v", v),
		[]string{"--service-account-token-path", tokenPath, "-v", v})
	if r := konnect(t, time.Minute, "doctor", "dial", b.addr, "--uds-name", tn.uds, "--request", "GET /"); r.code != 0 {
		t.Fatalf("dial through the tunnel: %s", r)
	}
	s := startSSHD(t)
	sp := startSocks(t, s, "-v", v)
	if err := socksGet(sp.addr, b.addr); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, tr, "-v", v)
	for _, p := range []string{"/api", "/apis", "/version"} {
		if err := httpOK("http://" + px.addr + p); err != nil {
			t.Fatal(err)
		}
	}
	secrets := keyChunks(t, append(pkiKeys(t, dir), s.clientKey)...)
	secrets["agent token"] = agentToken
	secrets["server kubeconfig token"] = "konnectivity-server-token-0123456789"
	secrets["proxy kubeconfig token"] = proxyToken
	for _, p := range []*harness.Proc{tn.server, tn.agent, sp.p, px.p} {
		if len(p.Log()) < 200 {
			t.Errorf("%s logged almost nothing at -v=%s; the check would prove nothing:\n%s", p.Name, v, p.Log())
		}
	}
	noSecretsIn(t, secrets, tn.server, tn.agent, sp.p, px.p)
}

// TestFileModes checks what konnect init writes: every file holding a private key is 0600 and the pki
// directory 0700; and the server's socket and the directory it creates for it are closed to others.
func TestFileModes(t *testing.T) {
	dir := filepath.Join(shortDir(t), "k")
	initMTLS(t, dir)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			if filepath.Base(path) == "pki" && info.Mode().Perm() != 0o700 {
				t.Errorf("%s: mode %v, want 0700", path, info.Mode().Perm())
			}
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "PRIVATE KEY") || strings.Contains(string(b), "client-key-data") {
			if info.Mode().Perm() != 0o600 {
				t.Errorf("%s holds a private key but has mode %v, want 0600", path, info.Mode().Perm())
			}
		} else if info.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s is writable by others: %v", path, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The server creates the socket's directory when it is missing.
	udsDir := filepath.Join(shortDir(t), "run", "konnectivity-server")
	uds := filepath.Join(udsDir, "konnectivity-server.socket")
	ports := harness.FreePorts(t, 3)
	sp := serverPorts{ports[0], ports[1], ports[2]}
	server := startKonnect(t, "server", serverArgs(dir, uds, sp, mtlsServer(dir)...)...)
	waitReady(t, server, sp.health)
	for _, p := range []string{udsDir, uds} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s: mode %v, open to others", p, info.Mode().Perm())
		}
		t.Logf("%s: %v", p, info.Mode())
	}
}

// TestCheckExpirationJSON checks that konnect certs check-expiration -o json is valid JSON, lists the
// certificates, and carries no key material; nor does its table, the default output.
func TestCheckExpirationJSON(t *testing.T) {
	dir := copyBase(t)
	r := konnect(t, time.Minute, "certs", "check-expiration", "--dir", dir, "-o", "json")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	var v any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	table := konnect(t, time.Minute, "certs", "check-expiration", "--dir", dir)
	if table.code != 0 {
		t.Fatalf("%s", table)
	}
	keys := keyChunks(t, pkiKeys(t, dir)...)
	for name, r := range map[string]result{"-o json": r, "the table": table} {
		for _, n := range []string{"ca", "front-proxy-ca", "konnectivity-server", "konnectivity-agent"} {
			if name == "-o json" && !strings.Contains(r.stdout, strconv.Quote(n)) || !strings.Contains(r.stdout, n) {
				t.Errorf("%s: %q missing from the output", name, n)
			}
		}
		out := r.stdout + r.stderr
		for _, bad := range []string{"PRIVATE KEY", "BEGIN", "client-key-data"} {
			if strings.Contains(out, bad) {
				t.Errorf("%s: the output contains %q", name, bad)
			}
		}
		for what, chunk := range keys {
			if strings.Contains(out, chunk) {
				t.Errorf("%s: the output contains %s", name, what)
			}
		}
	}
}
