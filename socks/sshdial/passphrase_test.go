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

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/test/harness"
)

// passphrases is a Config.Passphrase that gives the answers in turn, the last one again once they run out,
// and counts the questions per key file.
type passphrases struct {
	mu      sync.Mutex
	answers []string
	asked   map[string]int
}

func (p *passphrases) ask(file string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.asked == nil {
		p.asked = map[string]int{}
	}
	p.asked[file]++
	a := p.answers[0]
	if len(p.answers) > 1 {
		p.answers = p.answers[1:]
	}
	return []byte(a), nil
}

func (p *passphrases) count(file string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked[file]
}

// logged reports whether a line of logs says all of what.
func logged(logs *logBuffer, what ...string) bool {
	for _, line := range strings.Split(logs.String(), "\n") {
		all := true
		for _, w := range what {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}

// TestWrongPassphrase: as OpenSSH, a wrong passphrase is asked again, up to NumberOfPasswordPrompts (3)
// times for a key file in all, within one login; then the key is skipped with a log line naming it, the
// next identity is offered, and the key is not asked for again on reconnection. With no identity left, Run
// ends with a permanent error naming the key file and the wrong passphrase, instead of retrying (and
// asking) forever.
func TestWrongPassphrase(t *testing.T) {
	const right, wrong = "right-passphrase", "wrong-passphrase"
	const skipLine = "wrong passphrase; skipping it"
	// run starts a Dialer for cfg with p answering, logging everything.
	run := func(t *testing.T, cfg Config, p *passphrases) (*Dialer, <-chan error, *logBuffer) {
		t.Helper()
		var logs logBuffer
		cfg.Log = logs.logger()
		cfg.Passphrase = p.ask
		cfg.MinBackoff, cfg.MaxBackoff = 20*time.Millisecond, 50*time.Millisecond
		d, done := start(t, cfg)
		return d, done, &logs
	}

	t.Run("the only key", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, right)
		p := &passphrases{answers: []string{wrong}}
		_, done, logs := run(t, f.config(), p)
		err := waitErr(t, done)
		var ae *AuthError
		if !errors.As(err, &ae) || !permanent(err) {
			t.Fatalf("err = %v, want a permanent AuthError", err)
		}
		if want := f.key + " (3 tries)"; len(ae.WrongPassphrase) != 1 || ae.WrongPassphrase[0] != want {
			t.Errorf("WrongPassphrase = %q, want [%q]", ae.WrongPassphrase, want)
		}
		for _, s := range []string{"no identity was offered", "wrong passphrase for identity file " + f.key + " (3 tries)"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		if n := p.count(f.key); n != 3 {
			t.Errorf("passphrase asked %d times, want 3", n)
		}
		if !logged(logs, skipLine, f.key) {
			t.Errorf("no log line says the key %s is skipped:\n%s", f.key, logs)
		}
		if strings.Contains(logs.String(), "retrying") {
			t.Errorf("a wrong passphrase was retried as a failed connection:\n%s", logs)
		}
	})

	t.Run("NumberOfPasswordPrompts", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, right)
		cfg := f.config()
		cfg.ConfigFile = filepath.Join(t.TempDir(), "config")
		if err := os.WriteFile(cfg.ConfigFile, []byte("Host *\n  NumberOfPasswordPrompts 1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := &passphrases{answers: []string{wrong}}
		_, done, _ := run(t, cfg, p)
		err := waitErr(t, done)
		if !strings.Contains(err.Error(), "wrong passphrase for identity file "+f.key+" (1 try)") {
			t.Errorf("error %q does not name the key and its one try", err)
		}
		if n := p.count(f.key); n != 1 {
			t.Errorf("passphrase asked %d times, want 1", n)
		}
	})

	// As ssh, NumberOfPasswordPrompts 0 asks for no passphrase: the key, although -i names it, is not
	// offered, and the next identity is.
	t.Run("NumberOfPasswordPrompts 0", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, right)
		cfg := f.config()
		plain, plainPub := harness.SSHKeyPair(t, t.TempDir(), "id_plain", "")
		ak, err := os.OpenFile(filepath.Join(f.sshd.Dir, "authorized_keys"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(ak, plainPub)
		ak.Close()
		cfg.IdentityFiles = append(cfg.IdentityFiles, plain)
		cfg.ConfigFile = filepath.Join(t.TempDir(), "config")
		if err := os.WriteFile(cfg.ConfigFile, []byte("Host *\n  NumberOfPasswordPrompts 0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := &passphrases{answers: []string{right}}
		d, done, logs := run(t, cfg, p)
		waitReady(t, d, done)
		if n := p.count(f.key); n != 0 {
			t.Errorf("passphrase asked %d times, want none", n)
		}
		if !logged(logs, "allows no prompt (BatchMode yes or NumberOfPasswordPrompts 0)", f.key) {
			t.Errorf("no log line says the key %s is not offered:\n%s", f.key, logs)
		}
	})

	t.Run("right on the second try", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, right)
		p := &passphrases{answers: []string{wrong, right}}
		d, done, logs := run(t, f.config(), p)
		waitReady(t, d, done)
		if n := p.count(f.key); n != 2 {
			t.Errorf("passphrase asked %d times, want 2", n)
		}
		if strings.Contains(logs.String(), "SSH connection failed") {
			t.Errorf("the wrong passphrase failed the connection; it should be asked again within the login:\n%s", logs)
		}
		if strings.Contains(logs.String(), skipLine) {
			t.Errorf("the key is said to be skipped:\n%s", logs)
		}
	})

	t.Run("the next identity refused too", func(t *testing.T) {
		f := newFixture(t)
		enc, _ := harness.SSHKeyPair(t, t.TempDir(), "id_encrypted", right)
		other, _ := harness.SSHKeyPair(t, t.TempDir(), "id_other", "")
		cfg := f.config()
		cfg.IdentityFiles = []string{enc, other}
		_, done, _ := run(t, cfg, &passphrases{answers: []string{wrong}})
		err := waitErr(t, done)
		var ae *AuthError
		if !errors.As(err, &ae) {
			t.Fatalf("err = %v, want an AuthError", err)
		}
		for _, s := range []string{"accepted none of the identities offered: " + other, "not offered: wrong passphrase for identity file " + enc + " (3 tries)"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	})

	t.Run("the next identity", func(t *testing.T) {
		f := newFixture(t)
		be := backend(t)
		enc, _ := harness.SSHKeyPair(t, t.TempDir(), "id_encrypted", right)
		cfg := f.config()
		cfg.IdentityFiles = []string{enc, f.key}
		p := &passphrases{answers: []string{wrong}}
		d, done, logs := run(t, cfg, p)
		waitReady(t, d, done)
		if n := p.count(enc); n != 3 {
			t.Errorf("passphrase asked %d times, want 3", n)
		}
		if !logged(logs, skipLine, enc) {
			t.Errorf("no log line says the key %s is skipped:\n%s", enc, logs)
		}
		// A reconnection does not ask again for the key given up on.
		f.sshd.Restart()
		deadline := time.Now().Add(15 * time.Second)
		for strings.Count(logs.String(), "SSH connection established") < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("not reconnected within 15s:\n%s", logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
		get(t, d, be, "/after")
		if n := p.count(enc); n != 3 {
			t.Errorf("passphrase asked %d times after a reconnection, want still 3", n)
		}
	})
}

// TestNoPromptsIsPerHop: a hop whose settings allow no prompt (BatchMode yes, NumberOfPasswordPrompts 0)
// leaves an encrypted key out for itself only; a later hop that allows prompts still asks for it, as ssh,
// one process per hop, asks.
func TestNoPromptsIsPerHop(t *testing.T) {
	const right = "right-passphrase"
	key, _ := harness.SSHKeyPair(t, t.TempDir(), "id_enc", right)
	asked := 0
	k := newKeyring(func(string) ([]byte, error) { asked++; return []byte(right), nil }, false, logr.Discard())
	noPause := func() func() { return func() {} }
	if s, err := k.load(context.Background(), key, fromFlag, 0, noPause); s != nil || err != nil || asked != 0 {
		t.Fatalf("no prompts allowed: signer %v, err %v, asked %d times; want the key left out, unasked", s, err, asked)
	}
	if s, err := k.load(context.Background(), key, fromFlag, 3, noPause); s == nil || err != nil || asked != 1 {
		t.Fatalf("prompts allowed: signer %v, err %v, asked %d times; want the key, asked once", s, err, asked)
	}
}
