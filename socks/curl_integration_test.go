//go:build integration

package socks

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is required for this test: %v", err)
	}
	be := httpBackend(t)
	_, port, _ := net.SplitHostPort(be.Listener.Addr().String())
	addr := serve(t, &Server{}, Auto)
	authAddr := serve(t, &Server{Credentials: &Credentials{User: "u", Password: "p w"}}, Auto)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"socks5-hostname", []string{"--socks5-hostname", addr, "http://localhost:" + port + "/a"}},
		{"socks5 ip", []string{"--socks5", addr, "http://127.0.0.1:" + port + "/a"}},
		{"http proxy forward", []string{"--proxy", "http://" + addr, "http://localhost:" + port + "/a"}},
		{"http proxy CONNECT", []string{"--proxytunnel", "--proxy", "http://" + addr, "http://localhost:" + port + "/a"}},
		{"socks5 with auth", []string{"--socks5-hostname", authAddr, "--proxy-user", "u:p w", "http://localhost:" + port + "/a"}},
		{"http with auth", []string{"--proxy", "http://" + authAddr, "--proxy-user", "u:p w", "http://localhost:" + port + "/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-sS", "--max-time", "10", "--noproxy", ""}, tc.args...)
			cmd := exec.Command(curl, args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no *_proxy from the environment
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("curl %v: %v: %s", args, err, out)
			}
			if !strings.HasPrefix(string(out), "backend saw GET /a") {
				t.Fatalf("curl output %q", out)
			}
		})
	}
}
