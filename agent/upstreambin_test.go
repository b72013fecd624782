package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// upstreamProxyServer builds upstream's proxy-server v0.36.0 from the module cache, once per test binary.
func upstreamProxyServer(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "konnect-upstream-bin")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, "proxy-server"), "sigs.k8s.io/apiserver-network-proxy/cmd/server")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build proxy-server: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Skipf("cannot build upstream proxy-server: %v", buildErr)
	}
	return filepath.Join(buildDir, "proxy-server")
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// proxyServerProc is one run of the upstream proxy-server binary.
type proxyServerProc struct {
	cmd  *exec.Cmd
	uds  string
	done chan struct{}
}

func startProxyServerBinary(t *testing.T, bin string, pki *testPKI, dir string, agentPort int, id string) *proxyServerProc {
	t.Helper()
	certPEM, keyPEM := pki.ca.issue(t, "konnectivity-server", false, "127.0.0.1")
	cert, key := filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key")
	writeFile(t, cert, certPEM)
	writeFile(t, key, keyPEM)
	p := &proxyServerProc{uds: filepath.Join(dir, id+".sock"), done: make(chan struct{})}
	log, err := os.Create(filepath.Join(dir, id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "--mode=grpc", "--uds-name="+p.uds, "--delete-existing-uds-file",
		"--cluster-cert="+cert, "--cluster-key="+key, "--cluster-ca-cert="+pki.caFile,
		"--server-port=0", "--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(agentPort),
		"--admin-bind-address=127.0.0.1", "--admin-port="+strconv.Itoa(freePort(t)),
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(freePort(t)),
		"--server-id="+id, "--server-count=1", "--v=2")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); log.Close(); close(p.done) }()
	t.Cleanup(p.kill)
	return p
}

func (p *proxyServerProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proxyServerProc) dial(ctx context.Context, addr string) (net.Conn, error) {
	return (&upstreamServer{uds: p.uds}).dial(ctx, addr)
}

// TestUpstreamProxyServerBinary runs konnect's agent against the real upstream proxy-server binary:
// tunnels, a refused dial, and a server restart (kill -9) that the agent recovers from.
func TestUpstreamProxyServerBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the upstream binary")
	}
	bin := upstreamProxyServer(t)
	pki := newTestPKI(t)
	dir := t.TempDir()
	port := freePort(t)
	p := startProxyServerBinary(t, bin, pki, dir, port, "upstream-1")
	ra := startAgent(t, pki.config(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))))
	echo := startEcho(t)

	tunnelWorks := func(p *proxyServerProc) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := p.dial(ctx, echo.addr())
			if err != nil {
				return false
			}
			defer c.Close()
			roundTrip(t, c, 1<<20, 64<<10)
			return true
		}
	}
	eventually(t, 20*time.Second, "a tunnel through the upstream proxy-server", tunnelWorks(p))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := p.dial(ctx, echo.addr())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, 16<<20, 256<<10)
	c.Close()

	p.kill()
	eventually(t, 10*time.Second, "agent noticed the server died", func() bool { n, _ := ra.Connected(); return n == 0 })
	p2 := startProxyServerBinary(t, bin, pki, dir, port, "upstream-2")
	eventually(t, 20*time.Second, "a tunnel after the server restarted", tunnelWorks(p2))
	if st := ra.Status(); len(st) != 1 || st[0].ServerID != "upstream-2" {
		t.Fatalf("status %+v", st)
	}
}
