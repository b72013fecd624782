package proxycmd

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandListenRefuses: the proxy's listener is bound before serving, and an address in use, a file
// that is not a socket or a socket another server answers on is refused, naming the flag.
func TestCommandListenRefuses(t *testing.T) {
	b := newBackend(t)
	kc := b.kubeconfig(t, "cert")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, busyPort, _ := net.SplitHostPort(busy.Addr().String())
	notASocket := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notASocket, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	liveSocket := filepath.Join(t.TempDir(), "live.sock")
	live, err := net.Listen("unix", liveSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"non-loopback IPv6", []string{"--address=::", "--port=0"}, "--allow-remote"},
		{"address in use", []string{"--address=127.0.0.1", "--port=" + busyPort}, "address already in use"},
		{"existing file that is not a socket", []string{"--unix-socket=" + notASocket}, "--unix-socket"},
		{"socket of a running server", []string{"--unix-socket=" + liveSocket}, "in use"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := NewProxyCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append(c.args, "--kubeconfig", kc))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := cmd.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	if b, _ := os.ReadFile(notASocket); string(b) != "keep me" {
		t.Fatal("a file that was not a socket was replaced")
	}
	if c, err := net.Dial("unix", liveSocket); err != nil {
		t.Fatalf("the running server's socket was taken away: %v", err)
	} else {
		c.Close()
	}
}

// TestCommandUnixSocketIsPrivate: --unix-socket replaces a stale socket and creates one only its owner can
// use, as kubectl proxy does, and removes it on exit.
func TestCommandUnixSocketIsPrivate(t *testing.T) {
	b := newBackend(t)
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	_, stop := runCommand(t, "--kubeconfig", b.kubeconfig(t, "cert"), "--unix-socket", sock)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Fatalf("socket mode %v, want no access for group and others", perm)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://localhost/api")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %s", resp.Status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after Run: %v", err)
	}
}
