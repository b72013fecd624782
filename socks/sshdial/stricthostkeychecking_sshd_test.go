//go:build integration

package sshdial

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/konnect-dev/konnect/test/harness"
)

// StrictHostKeyChecking from the config file: accept-new records a new host; no is taken as accept-new,
// with a warning, and still refuses a changed key; yes refuses a new host.
func TestStrictHostKeyCheckingFromConfig(t *testing.T) {
	f := newFixture(t)
	run := func(t *testing.T, value, known string) (error, string, string) {
		t.Helper()
		kh := filepath.Join(t.TempDir(), "known_hosts")
		if known != "" {
			os.WriteFile(kh, []byte(known+"\n"), 0o600)
		}
		var mu sync.Mutex
		var logged []string
		cfg := f.config()
		cfg.KnownHostsFile = kh
		cfg.ConfigFile = writeSSHConfig(t, "Host *\n  StrictHostKeyChecking "+value+"\n")
		cfg.Log = funcr.New(func(prefix, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		for d.Ready() != nil && ctx.Err() == nil {
			select {
			case err := <-done:
				b, _ := os.ReadFile(kh)
				return err, string(b), strings.Join(logged, "\n")
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		<-done
		b, _ := os.ReadFile(kh)
		mu.Lock()
		defer mu.Unlock()
		return nil, string(b), strings.Join(logged, "\n")
	}
	t.Run("accept-new", func(t *testing.T) {
		err, kh, logged := run(t, "accept-new", "")
		if err != nil || !strings.Contains(kh, f.sshd.HostKeyLine) || !strings.Contains(logged, "StrictHostKeyChecking accept-new") {
			t.Fatalf("err %v, known_hosts %q, log %q: want connected, the key recorded and a log line", err, kh, logged)
		}
	})
	t.Run("no", func(t *testing.T) {
		err, kh, logged := run(t, "no", "")
		if err != nil || !strings.Contains(kh, f.sshd.HostKeyLine) || !strings.Contains(logged, "taken as accept-new") {
			t.Fatalf("err %v, known_hosts %q, log %q: want connected, the key recorded and a warning", err, kh, logged)
		}
		other, _ := harness.SSHKeyPair(t, t.TempDir(), "other", "")
		otherPub := mustRead(t, other+".pub")
		fields := strings.Fields(otherPub)
		changed := fmt.Sprintf("[%s]:%d %s %s", f.sshd.Host, f.sshd.Port, fields[0], fields[1])
		err, _, _ = run(t, "no", changed)
		var hk *HostKeyError
		if !errors.As(err, &hk) || !hk.Changed {
			t.Fatalf("changed key with StrictHostKeyChecking no: Run = %v, want a changed-key HostKeyError", err)
		}
	})
	t.Run("yes", func(t *testing.T) {
		err, kh, _ := run(t, "yes", "")
		var hk *HostKeyError
		if !errors.As(err, &hk) || hk.Changed || kh != "" {
			t.Fatalf("Run = %v, known_hosts %q: want an unknown-host HostKeyError and nothing recorded", err, kh)
		}
	})
}
