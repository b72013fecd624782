package tunnel

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// httpGet sends one HTTP/1.1 request over c and returns the response body.
func httpGet(t testing.TB, c net.Conn, host, path string) (*http.Response, []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	if err := req.Write(c); err != nil {
		t.Fatalf("write request: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 256<<10), req)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return res, body
}

func checkPattern(t testing.TB, b []byte, off int64) {
	t.Helper()
	for i := range b {
		if b[i] != pattern(off+int64(i)) {
			t.Fatalf("byte %d: got %d want %d", off+int64(i), b[i], pattern(off+int64(i)))
		}
	}
}

func dial(t testing.TB, f Frontend, addr string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := f.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial %s through %s (%s): %v", addr, f.UDSName, f.Mode, err)
	}
	return c
}

// echoRoundTrip writes n pattern bytes in writes of size chunk (0: one write) and reads them back.
func echoRoundTrip(t testing.TB, c net.Conn, n int64, chunk int) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(120 * time.Second))
	errc := make(chan error, 1)
	go func() {
		if chunk == 0 {
			b := make([]byte, n)
			fill(b, 0)
			_, err := c.Write(b)
			errc <- err
			return
		}
		b := make([]byte, chunk)
		for off := int64(0); off < n; off += int64(chunk) {
			m := min(int64(chunk), n-off)
			fill(b[:m], off)
			if _, err := c.Write(b[:m]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 1<<20)
	var got int64
	for got < n {
		m, err := c.Read(buf[:min(int64(len(buf)), n-got)])
		checkPattern(t, buf[:m], got)
		got += int64(m)
		if err != nil {
			t.Fatalf("read after %d of %d bytes: %v", got, n, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
}

func TestNoAgent(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			s := start(t, e.config(mode))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.frontend(mode).Dial(ctx, "127.0.0.1:1")
			if err == nil || !strings.Contains(err.Error(), "No agent available") {
				t.Fatalf("want No agent available, got %v", err)
			}
			if !failedAs(err, false, konnectivity.ErrNoAgent) {
				t.Errorf("not read back as no agent: %v", err)
			}
		})
	}
}

func TestServerGone(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Frontend{UDSName: dir + "/none.sock"}.Dial(ctx, "127.0.0.1:1")
	if err == nil || !failedAs(err, true, konnectivity.ErrNoSuchFile) {
		t.Fatalf("got %v, want a FrontendError for a missing socket", err)
	}
}

// TestStopDoesNotWaitForALeaseDeletion: a kube-apiserver that does not answer the deletion of the server's
// Lease holds the exit for leaseDeleteTimeout at most.
func TestStopDoesNotWaitForALeaseDeletion(t *testing.T) {
	client := fake.NewClientset()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	client.PrependReactor("delete", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return true, nil, nil
	})
	e := newEnv(t)
	cfg := e.config("grpc")
	cfg.GracefulTimeout = time.Second
	cfg.Leases = &Leases{Namespace: "kube-system", Labels: map[string]string{"k8s-app": "konnectivity-server"}, Client: client}
	s := start(t, cfg)
	began := time.Now()
	if err := s.Stop(t); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > cfg.GracefulTimeout+leaseDeleteTimeout+5*time.Second {
		t.Errorf("Run returned %v after its context ended", took)
	}
}

// failedAs reports whether a Dial error is reason, met while reaching the server (frontend, a
// *FrontendError) or past it. doctor's Reason (cmd/internal/doctorcmd) explains each such pair to operators.
func failedAs(err error, frontend bool, reason error) bool {
	var fe *FrontendError
	return errors.As(err, &fe) == frontend && errors.Is(konnectivity.Classify(err), reason)
}
