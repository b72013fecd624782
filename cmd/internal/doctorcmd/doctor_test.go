package doctorcmd

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
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
