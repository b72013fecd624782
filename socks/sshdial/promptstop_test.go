//go:build integration

package sshdial

import (
	"bufio"
	"context"
	"os"
	"testing"
	"time"
)

// promptStopBound is how soon Run must return once its context ends while a prompt waits: far within
// the grace a daemon gives each of its parts to stop (5 s), past which it reports the part as stuck.
const promptStopBound = 2 * time.Second

// unanswered is a question put to nobody: read waits for a line on a pipe that nobody writes to, and
// first says on asked that it waits. The pipe closes when the test ends, and the read returns then.
func unanswered(t *testing.T) (read func() ([]byte, error), asked <-chan struct{}) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); r.Close() })
	ch := make(chan struct{}, 1)
	return func() ([]byte, error) {
		select {
		case ch <- struct{}{}:
		default:
		}
		return bufio.NewReader(r).ReadBytes('\n')
	}, ch
}

// TestStopEndsAPrompt: konnect stopping (SIGTERM, Ctrl-C: Run's context ends) while a key's passphrase or a
// second factor waits for a person who does not answer ends the wait, and Run returns at once, instead of
// holding up the daemon until its grace runs out and it gives up on the SSH part.
func TestStopEndsAPrompt(t *testing.T) {
	stopsPromptly := func(t *testing.T, cfg Config, asked <-chan struct{}) {
		t.Helper()
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		select {
		case <-asked:
		case err := <-done:
			t.Fatalf("Run returned before asking: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("nothing was asked within 30s")
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(promptStopBound):
			t.Fatalf("Run did not return within %s of cancel while a prompt waited", promptStopBound)
		}
	}
	t.Run("passphrase", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, "not typed in time")
		read, asked := unanswered(t)
		cfg := f.config()
		cfg.Passphrase = func(string) ([]byte, error) { return read() }
		stopsPromptly(t, cfg, asked)
	})
	for _, method := range []string{"password", "keyboard-interactive"} {
		t.Run(method, func(t *testing.T) {
			f := newFixture(t)
			twoFactorSSHD(t, f, method)
			read, asked := unanswered(t)
			cfg := f.config()
			cfg.Ask = func(string, bool) (string, error) {
				b, err := read()
				return string(b), err
			}
			stopsPromptly(t, cfg, asked)
		})
	}
}
