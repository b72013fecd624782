//go:build integration

package sshdial

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// backend is a loopback HTTP server that answers with a fixed body.
func backend(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from backend %s", r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// fixture is a running sshd with a client key and a known_hosts file that trusts it.
type fixture struct {
	sshd       *harness.SSHD
	key        string
	knownHosts string
	dir        string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWithPassphrase(t, "")
}

// newFixtureWithPassphrase is newFixture with the client key encrypted with passphrase.
func newFixtureWithPassphrase(t *testing.T, passphrase string) *fixture {
	t.Helper()
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", passphrase)
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &fixture{sshd: srv, key: key, knownHosts: kh, dir: dir}
}

func (f *fixture) config() Config {
	return Config{
		Destination:    f.sshd.Addr(),
		IdentityFiles:  []string{f.key},
		ConfigFile:     "none",
		KnownHostsFile: f.knownHosts,
		AgentSocket:    "none",
		ConnectTimeout: 5 * time.Second,
	}
}

// start runs the dialer until the test ends and waits until it is connected.
func start(t *testing.T, cfg Config) (*Dialer, <-chan error) {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- d.Run(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
	return d, done
}

func waitReady(t *testing.T, d *Dialer, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for d.Ready() != nil {
		select {
		case err := <-done:
			t.Fatalf("Run returned before connecting: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not connected after 15s: %v", d.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get fetches path from addr over a connection made by dial.
func get(t *testing.T, d *Dialer, addr, path string) string {
	t.Helper()
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s via ssh: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDialThroughSSHD(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	d, done := start(t, f.config())
	waitReady(t, d, done)

	if got := get(t, d, be, "/ip"); got != "hello from backend /ip" {
		t.Fatalf("body = %q", got)
	}
	// A name is resolved by the server.
	_, port, _ := net.SplitHostPort(be)
	if got := get(t, d, "localhost:"+port, "/name"); got != "hello from backend /name" {
		t.Fatalf("body = %q", got)
	}
	if !strings.Contains(f.sshd.Log(), "Accepted publickey") {
		t.Fatalf("sshd log shows no publickey login:\n%s", f.sshd.Log())
	}
}

// TestAddressFamily: AddressFamily (ssh -4, -6) limits the connection to the SSH server to one address
// family, against a real sshd that listens on IPv4 loopback only.
func TestAddressFamily(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	v4 := f.config()
	v4.AddressFamily = "inet"
	d, done := start(t, v4)
	waitReady(t, d, done)
	if got := get(t, d, be, "/ip"); got != "hello from backend /ip" {
		t.Fatalf("body = %q", got)
	}
	v6 := f.config()
	v6.AddressFamily = "inet6"
	_, done6 := start(t, v6)
	err := waitErr(t, done6)
	if err == nil || !strings.Contains(err.Error(), "IPv6 only, as -4, -6 or AddressFamily asks") {
		t.Fatalf("IPv6 only, to an IPv4 address: %v; want an error that names the address family", err)
	}
	if n := strings.Count(f.sshd.Log(), "Accepted publickey"); n != 1 {
		t.Fatalf("%d logins, want the IPv4 one only", n)
	}
}

func TestDialErrorsCarryErrno(t *testing.T) {
	f := newFixture(t)
	d, done := start(t, f.config())
	waitReady(t, d, done)
	closed := harness.FreePort(t)
	_, err := d.DialContext(context.Background(), "tcp", fmt.Sprintf("127.0.0.1:%d", closed))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed port: err = %v, want ECONNREFUSED", err)
	}
	if _, err := d.DialContext(context.Background(), "udp", "127.0.0.1:53"); err == nil {
		t.Fatal("udp dial succeeded")
	}
	// A port that SSH cannot carry is the request's fault: the SSH connection stays up.
	logins := strings.Count(f.sshd.Log(), "Accepted publickey")
	for _, addr := range []string{"127.0.0.1:70000", "127.0.0.1:http"} {
		if _, err := d.DialContext(context.Background(), "tcp", addr); err == nil || !strings.Contains(err.Error(), "port") {
			t.Fatalf("dial %s: err = %v, want one naming the port", addr, err)
		}
	}
	if _, err := d.DialContext(context.Background(), "tcp", fmt.Sprintf("127.0.0.1:%d", closed)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after the bad ports: err = %v, want ECONNREFUSED", err)
	}
	if n := strings.Count(f.sshd.Log(), "Accepted publickey"); n != logins {
		t.Fatalf("the bad ports cost %d new SSH logins", n-logins)
	}
}

func TestHostKeys(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	otherKey, _ := harness.SSHKeyPair(t, t.TempDir(), "other", "")
	otherPub := publicKeyOf(t, otherKey)
	addr := f.sshd.Addr()

	t.Run("unknown host refused with fingerprint and line", func(t *testing.T) {
		cfg := f.config()
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts") // absent
		d, done := start(t, cfg)
		err := waitErr(t, done)
		var hk *HostKeyError
		if !errors.As(err, &hk) || hk.Changed {
			t.Fatalf("err = %v, want unknown-host HostKeyError", err)
		}
		want := knownhosts.Normalize(addr) + " " + f.sshd.HostKeyLine
		if hk.Line != want {
			t.Errorf("line = %q, want %q", hk.Line, want)
		}
		fp := ssh.FingerprintSHA256(parsePub(t, f.sshd.HostKeyLine))
		for _, s := range []string{fp, want, "AcceptNew"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error does not mention %q: %v", s, err)
			}
		}
		if _, serr := os.Stat(cfg.KnownHostsFile); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("known_hosts was created without --accept-new")
		}
		if d.Ready() == nil {
			t.Error("Ready() is nil after a refused host key")
		}
	})

	t.Run("changed key refused even with accept-new", func(t *testing.T) {
		cfg := f.config()
		cfg.AcceptNew = true
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		line := knownhosts.Line([]string{addr}, otherPub)
		os.WriteFile(cfg.KnownHostsFile, []byte(line+"\n"), 0o600)
		_, done := start(t, cfg)
		err := waitErr(t, done)
		var hk *HostKeyError
		if !errors.As(err, &hk) || !hk.Changed {
			t.Fatalf("err = %v, want changed-key HostKeyError", err)
		}
		if !strings.Contains(err.Error(), "REMOTE HOST IDENTIFICATION HAS CHANGED") || !strings.Contains(err.Error(), cfg.KnownHostsFile+":1") {
			t.Errorf("error is not loud or does not name the line: %v", err)
		}
		if b, _ := os.ReadFile(cfg.KnownHostsFile); string(b) != line+"\n" {
			t.Errorf("known_hosts changed: %q", b)
		}
	})

	t.Run("accept-new records and is then trusted", func(t *testing.T) {
		cfg := f.config()
		cfg.AcceptNew = true
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "sub", "known_hosts")
		d, done := start(t, cfg)
		waitReady(t, d, done)
		b, err := os.ReadFile(cfg.KnownHostsFile)
		if err != nil {
			t.Fatal(err)
		}
		if want := knownhosts.Normalize(addr) + " " + f.sshd.HostKeyLine + "\n"; string(b) != want {
			t.Fatalf("known_hosts = %q, want %q", b, want)
		}
		cfg.AcceptNew = false
		d2, done2 := start(t, cfg)
		waitReady(t, d2, done2)
		get(t, d2, be, "/")
	})

	t.Run("accept-new with HashKnownHosts records a hashed name", func(t *testing.T) {
		cfg := f.config()
		cfg.AcceptNew = true
		cfg.ConfigFile = filepath.Join(t.TempDir(), "config")
		os.WriteFile(cfg.ConfigFile, []byte("Host *\n  HashKnownHosts yes\n"), 0o600)
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		d, done := start(t, cfg)
		waitReady(t, d, done)
		b, _ := os.ReadFile(cfg.KnownHostsFile)
		if strings.Contains(string(b), "127.0.0.1") || !strings.HasPrefix(string(b), "|1|") || !strings.HasSuffix(string(b), " "+f.sshd.HostKeyLine+"\n") {
			t.Fatalf("known_hosts = %q, want one hashed line", b)
		}
		// OpenSSH trusts it.
		sshConfig := filepath.Join(t.TempDir(), "ssh_config")
		os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, localUser(), f.key)), 0o600)
		if ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); !ok {
			t.Fatalf("OpenSSH does not trust the hashed line: %s", out)
		}
	})

	t.Run("a line of an unknown key type is skipped", func(t *testing.T) {
		cfg := f.config()
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		blob := ssh.Marshal(struct{ Name, Params string }{"ssh-xmss@openssh.com", "XMSS_SHA2-256_W16_H10"})
		xmss := "other.example ssh-xmss@openssh.com " + base64.StdEncoding.EncodeToString(blob)
		os.WriteFile(cfg.KnownHostsFile, []byte(xmss+"\n"+knownhosts.Normalize(addr)+" "+f.sshd.HostKeyLine+"\n"), 0o600)
		sshConfig := filepath.Join(t.TempDir(), "ssh_config")
		os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, localUser(), f.key)), 0o600)
		if ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); !ok {
			t.Fatalf("OpenSSH refuses the file: %s", out)
		}
		d, done := start(t, cfg)
		waitReady(t, d, done)
		get(t, d, be, "/")
	})

	t.Run("hashed entry", func(t *testing.T) {
		cfg := f.config()
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		line := knownhosts.HashHostname(knownhosts.Normalize(addr)) + " " + f.sshd.HostKeyLine
		os.WriteFile(cfg.KnownHostsFile, []byte("# comment\n"+line+"\n"), 0o600)
		d, done := start(t, cfg)
		waitReady(t, d, done)
		get(t, d, be, "/")
	})

	t.Run("other key types for the host do not count as changed", func(t *testing.T) {
		// The file knows only the ed25519 key; the server also has an ECDSA key, which the SSH library
		// prefers by default and would then call "changed". The client must ask for ed25519 and succeed.
		f := newFixture(t)
		ecdsaKey := filepath.Join(f.sshd.Dir, "host_ecdsa")
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", ecdsaKey).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen ecdsa: %v: %s", err, out)
		}
		conf := filepath.Join(f.sshd.Dir, "sshd_config")
		cf, err := os.OpenFile(conf, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(cf, "HostKey %s\n", ecdsaKey); err != nil {
			t.Fatal(err)
		}
		cf.Close()
		f.sshd.Restart()
		cfg := f.config()
		d, done := start(t, cfg)
		waitReady(t, d, done)
		get(t, d, be, "/")
		if !strings.Contains(f.sshd.Log(), "ecdsa") {
			t.Errorf("sshd did not load the ECDSA host key; log:\n%s", f.sshd.Log())
		}
	})
}

func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run returned nil, want an error")
		}
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not fail within 20s")
	}
	return nil
}

func parsePub(t *testing.T, line string) ssh.PublicKey {
	t.Helper()
	k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func publicKeyOf(t *testing.T, privFile string) ssh.PublicKey {
	t.Helper()
	b, err := os.ReadFile(privFile + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return parsePub(t, string(b))
}

func TestJumpChain(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	jump1 := harness.StartSSHD(t, pub)
	jump2 := harness.StartSSHD(t, pub)
	target := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(jump1.KnownHostsLine()+"\n"+jump2.KnownHostsLine()+"\n"+target.KnownHostsLine()+"\n"), 0o600)
	be := backend(t)

	cfg := Config{
		Destination:    target.Addr(),
		JumpHosts:      []string{jump1.Addr(), jump2.Addr()},
		IdentityFiles:  []string{key},
		ConfigFile:     "none",
		KnownHostsFile: kh,
		AgentSocket:    "none",
		ConnectTimeout: 5 * time.Second,
	}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	if got := get(t, d, be, "/jump"); got != "hello from backend /jump" {
		t.Fatalf("body = %q", got)
	}
	// Each hop was reached through the previous one: jump1 forwarded to jump2, jump2 to the target, and
	// the target to the backend.
	_, bePort, _ := net.SplitHostPort(be)
	for _, c := range []struct {
		srv  *harness.SSHD
		port string
	}{{jump1, fmt.Sprint(jump2.Port)}, {jump2, fmt.Sprint(target.Port)}, {target, bePort}} {
		if !strings.Contains(c.srv.Log(), "target 127.0.0.1 port "+c.port) {
			t.Errorf("sshd on %d did not forward to port %s; log:\n%s", c.srv.Port, c.port, c.srv.Log())
		}
	}
}

// A jump host without an IdentityFile of its own gets the default identities (~/.ssh/id_*), as with OpenSSH,
// also when the target names one.
func TestJumpHostDefaultIdentity(t *testing.T) {
	home := t.TempDir()
	setHome(t, home)
	os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
	_, defaultPub := harness.SSHKeyPair(t, filepath.Join(home, ".ssh"), "id_ed25519", "")
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_target", "")
	jump, target, kh := startJumpPair(t, dir, defaultPub, pub)
	sshConfig := filepath.Join(dir, "config")
	os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host bastion\n  HostName 127.0.0.1\n  Port %d\n\nHost inner\n  HostName 127.0.0.1\n  Port %d\n  ProxyJump bastion\n  IdentityFile %s\n",
		jump.Port, target.Port, key)), 0o600)
	d, done := start(t, Config{Destination: "inner", ConfigFile: sshConfig, KnownHostsFile: kh, AgentSocket: "none", ConnectTimeout: 5 * time.Second})
	waitReady(t, d, done)
	get(t, d, backend(t), "/")
}

// startJumpPair starts a jump host that trusts jumpPub and a target that trusts targetPub, and writes
// dir/known_hosts with both.
func startJumpPair(t *testing.T, dir, jumpPub, targetPub string) (jump, target *harness.SSHD, knownHosts string) {
	t.Helper()
	jump, target = harness.StartSSHD(t, jumpPub), harness.StartSSHD(t, targetPub)
	knownHosts = filepath.Join(dir, "known_hosts")
	os.WriteFile(knownHosts, []byte(jump.KnownHostsLine()+"\n"+target.KnownHostsLine()+"\n"), 0o600)
	return jump, target, knownHosts
}

func TestJumpFromSSHConfig(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	jump, target, kh := startJumpPair(t, dir, pub, pub)
	sshConfig := filepath.Join(dir, "config")
	os.WriteFile(sshConfig, []byte(fmt.Sprintf(`Host bastion
  HostName 127.0.0.1
  Port %d
  IdentityFile %s

Host inner
  HostName 127.0.0.1
  Port %d
  ProxyJump bastion
  IdentityFile %s
  ServerAliveInterval 1
`, jump.Port, key, target.Port, key)), 0o600)
	be := backend(t)
	cfg := Config{Destination: "inner", ConfigFile: sshConfig, KnownHostsFile: kh, AgentSocket: "none", ConnectTimeout: 5 * time.Second}
	d, done := start(t, cfg)
	if d.plan.aliveInterval != time.Second {
		t.Errorf("ServerAliveInterval = %s, want 1s from the config file", d.plan.aliveInterval)
	}
	waitReady(t, d, done)
	get(t, d, be, "/")
	if !strings.Contains(jump.Log(), fmt.Sprintf("target 127.0.0.1 port %d", target.Port)) {
		t.Errorf("the jump host did not forward to the target")
	}
	// Keepalives every second reach the target (sshd logs each global request at DEBUG1), are answered,
	// and the connection stays up.
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(target.Log(), "keepalive@openssh.com") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no two keepalives reached the target within 10s; log:\n%s", target.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.Ready(); err != nil {
		t.Fatalf("connection dropped with keepalives on: %v", err)
	}
}

func TestAgentAuth(t *testing.T) {
	dir := t.TempDir()
	setHome(t, dir) // no default identity files
	key, pub := harness.SSHKeyPair(t, dir, "id_agent", "agent-pass")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	// ssh-add reads the passphrase from SSH_ASKPASS without a terminal.
	askpass := filepath.Join(dir, "askpass")
	os.WriteFile(askpass, []byte("#!/bin/sh\necho agent-pass\n"), 0o700)
	t.Setenv("SSH_ASKPASS", askpass)
	t.Setenv("SSH_ASKPASS_REQUIRE", "force")
	t.Setenv("DISPLAY", ":0")
	sock := harness.SSHAgent(t, key)
	t.Setenv("SSH_AUTH_SOCK", sock)

	cfg := Config{Destination: srv.Addr(), ConfigFile: "none", KnownHostsFile: kh, ConnectTimeout: 5 * time.Second}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, backend(t), "/")

	// Without the agent the same (encrypted) key cannot be used, which shows the agent did the work.
	cfg.AgentSocket = "none"
	cfg.IdentityFiles = []string{key}
	d2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d2.keys.passphrase = func(string) ([]byte, error) { return nil, errNoTerminal }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = d2.Run(ctx)
	var ek *EncryptedKeyError
	if !errors.As(err, &ek) || ek.File != key {
		t.Fatalf("Run without agent: err = %v, want EncryptedKeyError for %s", err, key)
	}
	if !strings.Contains(err.Error(), "ssh-add "+key) {
		t.Errorf("error does not say how to fix it: %v", err)
	}
}

func TestEncryptedKeyWithPassphrase(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_enc", "s3cret")
	srv := harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	os.WriteFile(kh, []byte(srv.KnownHostsLine()+"\n"), 0o600)
	asked := 0
	cfg := Config{
		Destination: srv.Addr(), IdentityFiles: []string{key}, ConfigFile: "none", KnownHostsFile: kh,
		AgentSocket: "none", ConnectTimeout: time.Second,
		// A person is slower than the connect timeout; the handshake waits for them.
		Passphrase: func(f string) ([]byte, error) {
			asked++
			time.Sleep(1500 * time.Millisecond)
			return []byte("s3cret"), nil
		},
	}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	if asked != 1 {
		t.Fatalf("passphrase asked %d times, want 1", asked)
	}
}

func TestAuthFailureIsPermanent(t *testing.T) {
	f := newFixture(t)
	wrong, _ := harness.SSHKeyPair(t, t.TempDir(), "id_wrong", "")
	cfg := f.config()
	cfg.IdentityFiles = []string{wrong}
	_, done := start(t, cfg)
	err := waitErr(t, done)
	var ae *AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want AuthError", err)
	}
}

func TestReconnectAfterSSHDRestart(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	cfg := f.config()
	cfg.ConnectTimeout = 10 * time.Second
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, be, "/before")

	f.sshd.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for d.Ready() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Ready() still nil 10s after sshd was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(d.Ready().Error(), "down") {
		t.Errorf("Ready() = %v", d.Ready())
	}
	// A dial made while the connection is down waits for the reconnect.
	result := make(chan error, 1)
	go func() {
		c, err := d.DialContext(context.Background(), "tcp", be)
		if err == nil {
			c.Close()
		}
		result <- err
	}()
	time.Sleep(300 * time.Millisecond)
	f.sshd.Restart()
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("dial during reconnect: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dial during reconnect did not finish")
	}
	waitReady(t, d, done)
	get(t, d, be, "/after")
}

func TestDialWaitIsBounded(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.ConnectTimeout = 700 * time.Millisecond
	d, done := start(t, cfg)
	waitReady(t, d, done)
	f.sshd.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for d.Ready() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Ready() still nil 10s after sshd was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	_, err := d.DialContext(context.Background(), "tcp", "127.0.0.1:1")
	if err == nil || time.Since(t0) > 5*time.Second {
		t.Fatalf("dial while down: err = %v after %s; want an error within the connect timeout", err, time.Since(t0))
	}
}

func TestCipherChoice(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Ciphers = []string{ssh.CipherChaCha20Poly1305}
	d, done := start(t, cfg)
	waitReady(t, d, done)
	get(t, d, backend(t), "/")
	if !strings.Contains(f.sshd.Log(), "chacha20-poly1305@openssh.com") {
		t.Errorf("sshd log does not show the chosen cipher")
	}
}

// opensshAccepts runs OpenSSH's own client with the same ssh_config and known_hosts and reports whether it
// trusts the host, so that konnect's reading of both is checked against the real thing.
func opensshAccepts(t *testing.T, sshConfig, knownHosts, dest string) (bool, string) {
	t.Helper()
	harness.RequireSSH(t, "ssh")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-F", sshConfig, "-o", "UserKnownHostsFile="+knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", dest, "true").CombinedOutput()
	return err == nil, string(out)
}

// HostKeyAlias from ssh_config names the host in known_hosts instead of its address, without a port, as
// OpenSSH does: a host reached through a forwarded port or by several names keeps one entry.
func TestHostKeyAlias(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	sshConfig := filepath.Join(f.dir, "config")
	os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  HostKeyAlias bastion-key\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, f.key)), 0o600)
	aliasLine := "bastion-key " + f.sshd.HostKeyLine
	cfg := Config{Destination: "target", ConfigFile: sshConfig, AgentSocket: "none", ConnectTimeout: 5 * time.Second}

	t.Run("the alias's entry is trusted", func(t *testing.T) {
		cfg := cfg
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		os.WriteFile(cfg.KnownHostsFile, []byte(aliasLine+"\n"), 0o600)
		d, done := start(t, cfg)
		waitReady(t, d, done)
		get(t, d, be, "/")
		if ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); !ok {
			t.Errorf("OpenSSH refuses the same known_hosts: %s", out)
		}
	})

	t.Run("the address's entry is not", func(t *testing.T) {
		cfg := cfg
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		os.WriteFile(cfg.KnownHostsFile, []byte(f.sshd.KnownHostsLine()+"\n"), 0o600)
		_, done := start(t, cfg)
		var hk *HostKeyError
		if err := waitErr(t, done); !errors.As(err, &hk) || hk.Host != "bastion-key" || hk.Line != aliasLine {
			t.Fatalf("err = %v, want an unknown-host error for bastion-key offering %q", err, aliasLine)
		}
		if ok, _ := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target"); ok {
			t.Errorf("OpenSSH trusts the address's entry although HostKeyAlias is set")
		}
	})

	t.Run("accept-new records the alias", func(t *testing.T) {
		cfg := cfg
		cfg.AcceptNew = true
		cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
		d, done := start(t, cfg)
		waitReady(t, d, done)
		if b, _ := os.ReadFile(cfg.KnownHostsFile); string(b) != aliasLine+"\n" {
			t.Fatalf("known_hosts = %q, want %q", b, aliasLine+"\n")
		}
	})
}

// signHostKey signs sshd's host key with the CA key for the given principals and has sshd present the
// certificate.
func signHostKey(t *testing.T, s *harness.SSHD, ca string, principals string) {
	t.Helper()
	if out, err := exec.Command("ssh-keygen", "-q", "-s", ca, "-I", "test-host", "-h", "-n", principals, "-V", "-5m:+1h", s.HostKeyFile+".pub").CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -s: %v: %s", err, out)
	}
	conf := filepath.Join(s.Dir, "sshd_config")
	cf, err := os.OpenFile(conf, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(cf, "HostCertificate %s-cert.pub\n", s.HostKeyFile)
	cf.Close()
	s.Restart()
}

// Host certificates: an @cert-authority line trusts every host key its CA signed for the name dialled; a
// certificate it does not vouch for is judged by its plain key, as OpenSSH does.
func TestHostCertificates(t *testing.T) {
	f := newFixture(t)
	be := backend(t)
	dir := t.TempDir()
	ca, caPub := harness.SSHKeyPair(t, dir, "host_ca", "")
	_, otherPub := harness.SSHKeyPair(t, dir, "other_ca", "")
	signHostKey(t, f.sshd, ca, "127.0.0.1")
	host := knownhosts.Normalize(f.sshd.Addr())
	sshConfig := filepath.Join(dir, "config")
	os.WriteFile(sshConfig, []byte(fmt.Sprintf("Host target\n  HostName 127.0.0.1\n  Port %d\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n", f.sshd.Port, localUser(), f.key)), 0o600)
	for _, c := range []struct {
		name, knownHosts string
		trusted          bool
	}{
		{"the CA of the certificate", "@cert-authority " + host + " " + caPub, true},
		{"another CA", "@cert-authority " + host + " " + otherPub, false},
		{"another CA, and the plain key", "@cert-authority " + host + " " + otherPub + "\n" + f.sshd.KnownHostsLine(), true},
		{"the CA for another host", "@cert-authority other.example " + caPub, false},
		// Patterns match "[host]:port" on ports other than 22, as OpenSSH matches them.
		{"the CA for every host", "@cert-authority * " + caPub, true},
		{"the CA for any port of the address", "@cert-authority [127.0.0.1]:* " + caPub, true},
		// OpenSSH tries the host without the port as well: the negation has to name both.
		{"the CA for every host but this port", "@cert-authority *,![127.0.0.1]:* " + caPub, true},
		{"the CA for every host but this one", "@cert-authority *,![127.0.0.1]:*,!127.0.0.1 " + caPub, false},
		{"the CA for a hashed name", "@cert-authority " + knownhosts.HashHostname(host) + " " + caPub, true},
		{"a revoked CA", "@cert-authority * " + caPub + "\n@revoked * " + caPub, false},
		// A CA key is not a host key: OpenSSH looks the plain key up among the plain lines alone.
		{"the host's own key, as a CA", "@cert-authority " + host + " " + f.sshd.HostKeyLine, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := f.config()
			cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
			os.WriteFile(cfg.KnownHostsFile, []byte(c.knownHosts+"\n"), 0o600)
			ok, out := opensshAccepts(t, sshConfig, cfg.KnownHostsFile, "target")
			if ok != c.trusted {
				t.Fatalf("OpenSSH trusted=%v, want %v: %s", ok, c.trusted, out)
			}
			d, done := start(t, cfg)
			if !c.trusted {
				var hk *HostKeyError
				if err := waitErr(t, done); !errors.As(err, &hk) || hk.Line != host+" "+f.sshd.HostKeyLine || hk.Revoked != strings.Contains(c.name, "revoked") {
					t.Fatalf("err = %v, want a HostKeyError offering the plain key (revoked: %v)", err, strings.Contains(c.name, "revoked"))
				}
				return
			}
			waitReady(t, d, done)
			get(t, d, be, "/")
		})
	}
}

// TestJumpHostsOwnProxyJump: as with ssh -J, the first jump host is reached through its own ProxyJump, and
// the first host of that one through its own in turn; a later jump host's ProxyJump is not followed, since
// the hop before it reaches it. Three real sshd: outer forwards to inner, inner to the target.
func TestJumpHostsOwnProxyJump(t *testing.T) {
	dir := t.TempDir()
	key, pub := harness.SSHKeyPair(t, dir, "id_client", "")
	outer, inner, target := harness.StartSSHD(t, pub), harness.StartSSHD(t, pub), harness.StartSSHD(t, pub)
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(outer.KnownHostsLine()+"\n"+inner.KnownHostsLine()+"\n"+target.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sshConfig := filepath.Join(dir, "config")
	if err := os.WriteFile(sshConfig, []byte(fmt.Sprintf(`Host outer
  HostName 127.0.0.1
  Port %d
Host inner
  HostName 127.0.0.1
  Port %d
  ProxyJump outer
Host target
  HostName 127.0.0.1
  Port %d
  ProxyJump inner
Host *
  IdentityFile %s
`, outer.Port, inner.Port, target.Port, key)), 0o600); err != nil {
		t.Fatal(err)
	}
	be := backend(t)
	_, bePort, _ := net.SplitHostPort(be)
	forwarded := func(srv *harness.SSHD, port int) bool {
		return strings.Contains(srv.Log(), fmt.Sprintf("target 127.0.0.1 port %d", port))
	}

	d, done := start(t, Config{Destination: "target", ConfigFile: sshConfig, KnownHostsFile: kh, AgentSocket: "none", ConnectTimeout: 5 * time.Second})
	if got := routeString(d.plan.hops); got != "outer -> inner -> target" {
		t.Fatalf("route %s, want outer -> inner -> target", got)
	}
	waitReady(t, d, done)
	if got := get(t, d, be, "/chain"); got != "hello from backend /chain" {
		t.Fatalf("body = %q", got)
	}
	if !forwarded(outer, inner.Port) || !forwarded(inner, target.Port) || !strings.Contains(target.Log(), "target 127.0.0.1 port "+bePort) {
		t.Errorf("not outer -> inner -> target -> backend; logs:\nouter:\n%s\ninner:\n%s", outer.Log(), inner.Log())
	}

	// -J names the route: its first host's own ProxyJump is followed, the second's is not.
	p, err := resolve(Config{Destination: "target", JumpHosts: []string{"inner"}, ConfigFile: sshConfig})
	if err != nil {
		t.Fatal(err)
	}
	if got := routeString(p.hops); got != "outer -> inner -> target" {
		t.Errorf("-J inner: route %s, want outer -> inner -> target", got)
	}
	p, err = resolve(Config{Destination: "target", JumpHosts: []string{fmt.Sprintf("127.0.0.1:%d", outer.Port), "inner"}, ConfigFile: sshConfig})
	if err != nil {
		t.Fatal(err)
	}
	if got := routeString(p.hops); got != "127.0.0.1 -> inner -> target" {
		t.Errorf("-J outer-address,inner: route %s, want inner reached through the hop before it", got)
	}
}
