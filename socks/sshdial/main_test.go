package sshdial

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if log := os.Getenv("SSHDIAL_TEST_NETCAT"); log != "" {
		os.Exit(testNetcat(log, os.Args[1:]))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction(harness.SpawnerFunc),
	)
}

// testNetcat is the test binary run as a ProxyCommand: it appends its pid and arguments to log, connects to
// args[0]:args[1] and copies stdin and stdout to and from the connection. Like a stubborn real command it
// ignores SIGHUP and does not stop when its stdin ends, only when the server closes: the dialer must kill it.
func testNetcat(log string, args []string) int {
	signal.Ignore(syscall.SIGHUP)
	f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintf(f, "%d %s\n", os.Getpid(), strings.Join(args, " "))
	f.Close()
	c, err := net.Dial("tcp", net.JoinHostPort(args[0], args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testnetcat:", err)
		return 1
	}
	go func() {
		io.Copy(c, os.Stdin)
		c.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(os.Stdout, c)
	return 0
}
