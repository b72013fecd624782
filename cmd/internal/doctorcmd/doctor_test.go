package doctorcmd

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
)

func runCmd(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := NewDoctorCommand()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// TestDoctorRefusesTimeouts: a --timeout that is not positive would fail every check, and each command
// says so, naming the flag, before it tries anything.
func TestDoctorRefusesTimeouts(t *testing.T) {
	for _, args := range [][]string{
		{"status", "--admin-address", "127.0.0.1:1", "--timeout", "0s"},
		{"dial", "127.0.0.1:1", "--uds-name", "/nonexistent/s.sock", "--timeout", "-1s"},
		{"extensions", "--kubeconfig", "/nonexistent/kubeconfig", "--timeout", "0s"},
	} {
		if _, err := runCmd(t, context.Background(), args...); err == nil || !strings.Contains(err.Error(), "--timeout must be positive") {
			t.Errorf("doctor %v: %v", args, err)
		}
	}
}

// TestDoctorDialRefusesAddresses: an ADDRESS no agent could dial is refused before anything is sent, naming
// the argument; the agent would answer with a failure that says nothing of the address. The socket exists
// and accepts, so that an address that got through would be sent.
func TestDoctorDialRefusesAddresses(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:99999", `ADDRESS "127.0.0.1:99999": port "99999" is not a number from 1 to 65535`},
		{"127.0.0.1:0", `port "0"`},
		{"127.0.0.1:-1", `port "-1"`},
		{"127.0.0.1:https", `port "https"`},
		{"[::1]:65536", `port "65536"`},
		{":443", `ADDRESS ":443" must be host:port: the host is empty`},
		{"127.0.0.1", `ADDRESS "127.0.0.1" must be host:port`},
	} {
		out, err := runCmd(t, context.Background(), "dial", tc.addr, "--uds-name", sock, "--timeout", "2s")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("doctor dial %s: %v, want %q\n%s", tc.addr, err, tc.want, out)
		}
	}
	select {
	case <-accepted:
		t.Error("a refused address was sent to the server")
	default:
	}
}

// The doctor asks admin ports directly: an HTTP(S)_PROXY in the environment must not carry its requests to
// a server's node or pod address (Go's default transport would, for every address but loopback).
func TestDoctorIgnoresProxyEnvironment(t *testing.T) {
	tr, ok := adminClient.Transport.(*http.Transport)
	if !ok || tr.Proxy != nil {
		t.Fatalf("the doctor's transport uses a proxy function: %#v", adminClient.Transport)
	}
}

// TestStatusAsksTheStaticPodByDefault: konnect doctor status with no flags asks the admin port that the static
// pod konnect init writes uses.
func TestStatusAsksTheStaticPodByDefault(t *testing.T) {
	want := net.JoinHostPort("127.0.0.1", strconv.Itoa(manifests.DefaultAdminPort))
	if got := newStatusCommand().Flags().Lookup("admin-address").Value.String(); got != "["+want+"]" {
		t.Fatalf("default --admin-address %s, want %s", got, want)
	}
	if args := strings.Join((manifests.Server{}).Args(), " "); !strings.Contains(args, "--admin-port="+strconv.Itoa(manifests.DefaultAdminPort)) {
		t.Fatalf("static pod args %s", args)
	}
}

// doctor dial, like doctor status, defaults to the static pod that konnect init writes: its socket, as status
// defaults to its admin port.
func TestDoctorDialDefaultsToTheStaticPodSocket(t *testing.T) {
	dial, _, err := NewDoctorCommand().Find([]string{"dial"})
	if err != nil {
		t.Fatal(err)
	}
	if got := dial.Flags().Lookup("uds-name").DefValue; got != kubeapiserver.DefaultUDSName {
		t.Errorf("doctor dial --uds-name defaults to %q, want the static pod's %s", got, kubeapiserver.DefaultUDSName)
	}
	// Without the flag the dial is tried (and here fails, naming the socket), not refused for a missing flag.
	if _, err := os.Stat(kubeapiserver.DefaultUDSName); err == nil {
		t.Logf("%s exists on this machine; checking the defaults only", kubeapiserver.DefaultUDSName)
		return
	}
	out, err := runCmd(t, context.Background(), "dial", "127.0.0.1:1", "--timeout", "2s")
	if err == nil || strings.Contains(err.Error(), "required") || !strings.Contains(out, "through "+kubeapiserver.DefaultUDSName) {
		t.Errorf("doctor dial without --uds-name: %v\n%s", err, out)
	}
}
