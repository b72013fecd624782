//go:build integration

package socks

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// curl runs the real curl with args, after -sS --max-time 10 and no proxy from the environment.
func curl(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is required for this test: %v", err)
	}
	cmd := exec.Command(bin, append([]string{"-sS", "--max-time", "10", "--noproxy", ""}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no *_proxy from the environment
	return cmd.CombinedOutput()
}

// backendPort is the port of a backend that answers "backend saw ...".
func backendPort(t *testing.T) string {
	_, port, _ := net.SplitHostPort(httpBackend(t).Listener.Addr().String())
	return port
}

func TestCurl(t *testing.T) {
	port := backendPort(t)
	addr := serve(t, &Server{}, Auto)
	authAddr := serve(t, &Server{Credentials: &Credentials{User: "u", Password: "p w"}}, Auto)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"socks5-hostname", []string{"--socks5-hostname", addr, "http://localhost:" + port + "/a"}},
		{"socks5 ip", []string{"--socks5", addr, "http://127.0.0.1:" + port + "/a"}},
		{"socks4a", []string{"--socks4a", addr, "http://localhost:" + port + "/a"}},
		{"socks4", []string{"--socks4", addr, "http://127.0.0.1:" + port + "/a"}},
		{"http proxy forward", []string{"--proxy", "http://" + addr, "http://localhost:" + port + "/a"}},
		{"http proxy CONNECT", []string{"--proxytunnel", "--proxy", "http://" + addr, "http://localhost:" + port + "/a"}},
		{"socks5 with auth", []string{"--socks5-hostname", authAddr, "--proxy-user", "u:p w", "http://localhost:" + port + "/a"}},
		{"http with auth", []string{"--proxy", "http://" + authAddr, "--proxy-user", "u:p w", "http://localhost:" + port + "/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := curl(t, tc.args...)
			if err != nil {
				t.Fatalf("curl %v: %v: %s", tc.args, err, out)
			}
			if !strings.HasPrefix(string(out), "backend saw GET /a") {
				t.Fatalf("curl output %q", out)
			}
		})
	}
}

// TestCurlSOCKS4Refused: a proxy that requires a password refuses SOCKS4, which cannot carry one, with
// SOCKS4's "rejected" reply at once (curl: "request rejected"), not a timeout; so does one past its
// connection cap; a destination that cannot be reached is rejected too.
func TestCurlSOCKS4Refused(t *testing.T) {
	port := backendPort(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	authAddr := serve(t, &Server{Credentials: &Credentials{User: "u", Password: "p"}}, Auto)
	addr := serve(t, &Server{}, Auto)
	fullAddr := serve(t, &Server{MaxConns: 1}, Auto)
	held, err := net.Dial("tcp", fullAddr) // takes the one slot, in its handshake
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, tc := range []struct{ name, proxy, url string }{
		{"password required", authAddr, "http://localhost:" + port + "/a"},
		{"unreachable", addr, "http://" + closedAddr + "/a"},
		{"past the connection cap", fullAddr, "http://localhost:" + port + "/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, err := curl(t, "--socks4a", tc.proxy, tc.url)
			if err == nil {
				t.Fatalf("curl succeeded: %s", out)
			}
			if !strings.Contains(strings.ToLower(string(out)), "rejected") || time.Since(start) > 3*time.Second {
				t.Fatalf("curl after %v: %v: %s; want SOCKS4's rejection at once", time.Since(start), err, out)
			}
		})
	}
}
