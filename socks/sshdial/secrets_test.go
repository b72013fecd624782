//go:build integration

package sshdial

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// maxVerbosity logs every line, whatever its level: more than any -v a daemon is given.
const maxVerbosity = 1 << 20

// Secrets a person types, each used nowhere else, so that finding one anywhere is a leak.
const (
	passphraseSecret      = "pass-3d0c9f1e-typed-once"
	wrongPassphraseSecret = "wrongpass-71ab2c45-typed-once"
	answerSecret          = "answer-5e8a17b2-typed-once"
	wrongAnswerSecret     = "wronganswer-c94f3d60-typed-once"
)

var allSecrets = []string{passphraseSecret, wrongPassphraseSecret, answerSecret, wrongAnswerSecret}

// logBuffer is a logger at maxVerbosity and what it logged.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		fmt.Fprintln(&l.b, prefix, args)
	}, funcr.Options{Verbosity: maxVerbosity})
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// noSecret fails t if what, named where, holds any of the secrets.
func noSecret(t *testing.T, where, what string) {
	t.Helper()
	for _, s := range allSecrets {
		if strings.Contains(what, s) {
			t.Errorf("%s holds the secret %q:\n%s", where, s, what)
		}
	}
}

// retainedSecrets returns the paths at which v holds one of the secrets in a string or a byte slice or
// array, following pointers, interfaces, structs, slices, arrays and maps, unexported fields included.
// Functions and channels are not entered; skip, when set, says which struct types are not either.
func retainedSecrets(v any, skip func(reflect.Type) bool) []string {
	var found []string
	check := func(path string, b []byte) {
		for _, s := range allSecrets {
			if strings.Contains(string(b), s) {
				found = append(found, path+" holds "+s)
			}
		}
	}
	type seenKey struct {
		p uintptr
		t reflect.Type
	}
	seen := map[seenKey]bool{}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() {
				return
			}
			k := seenKey{v.Pointer(), v.Type()}
			if seen[k] {
				return
			}
			seen[k] = true
			walk(v.Elem(), path)
		case reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem(), path)
			}
		case reflect.Struct:
			if skip != nil && skip(v.Type()) {
				return
			}
			for i := range v.NumField() {
				walk(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		case reflect.String:
			check(path, []byte(v.String()))
		case reflect.Slice, reflect.Array:
			if v.Kind() == reflect.Slice && v.IsNil() {
				return
			}
			if v.Type().Elem().Kind() == reflect.Uint8 {
				if v.Kind() == reflect.Slice {
					check(path, v.Bytes())
					return
				}
				b := make([]byte, v.Len())
				for i := range b {
					b[i] = byte(v.Index(i).Uint())
				}
				check(path, b)
				return
			}
			for i := range v.Len() {
				walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			}
		case reflect.Map:
			it := v.MapRange()
			for it.Next() {
				walk(it.Key(), path+"{key}")
				walk(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key()))
			}
		}
	}
	walk(reflect.ValueOf(v), reflect.TypeOf(v).String())
	return found
}

// liveState is what may change under a running dialer without the locks its walk holds (d.mu and
// d.keys.mu): the SSH library's connections, atomic counters and the locks themselves.
func liveState(t reflect.Type) bool {
	return strings.HasPrefix(t.PkgPath(), "golang.org/x/crypto/ssh") || t.PkgPath() == "sync/atomic" || t.PkgPath() == "sync"
}

// TestSecretsAreNeitherLoggedNorKept: what a person types (a key's passphrase, a password or
// keyboard-interactive answer) appears in no log line at any level and in no error, and nothing the
// Dialer holds keeps it, while connected or after Run returned: the README says answers are never stored or
// logged. Each secret is a string used nowhere else.
func TestSecretsAreNeitherLoggedNorKept(t *testing.T) {
	// run runs a Dialer for cfg, logging everything at every level. wait returns once the case has played
	// out: connected, or failed, with the error that says so; run then checks the error, Ready, what the
	// Dialer holds while Run still runs (or after it returned), and, after Run returned, the Dialer, Run's
	// error and the log.
	run := func(t *testing.T, cfg Config, wait func(d *Dialer, ended func() (error, bool)) error) {
		t.Helper()
		var logs logBuffer
		cfg.Log = logs.logger()
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var runErr error
		finished := make(chan struct{})
		go func() { runErr = d.Run(ctx); close(finished) }()
		ended := func() (error, bool) {
			select {
			case <-finished:
				return runErr, true
			default:
				return nil, false
			}
		}
		if err := wait(d, ended); err != nil {
			noSecret(t, "the error", err.Error())
		}
		noSecret(t, "Ready", fmt.Sprint(d.Ready()))
		d.mu.Lock()
		d.keys.mu.Lock()
		for _, p := range retainedSecrets(d, liveState) {
			t.Errorf("the Dialer keeps a secret while Run runs: %s", p)
		}
		d.keys.mu.Unlock()
		d.mu.Unlock()
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return within 10s of cancel")
		}
		for _, p := range retainedSecrets(d, nil) {
			t.Errorf("the Dialer keeps a secret after Run returned: %s", p)
		}
		for _, p := range retainedSecrets(cfg, nil) {
			t.Errorf("the Config keeps a secret: %s", p)
		}
		if runErr != nil {
			noSecret(t, "Run's error", fmt.Sprintf("%v | %+v | %#v", runErr, runErr, runErr))
		}
		noSecret(t, "the log", logs.String())
		if logs.String() == "" {
			t.Error("nothing was logged: the check of the log proves nothing")
		}
	}
	// failure waits until Ready or Run's end reports an error that says want.
	failure := func(t *testing.T, want string) func(d *Dialer, ended func() (error, bool)) error {
		return func(d *Dialer, ended func() (error, bool)) error {
			deadline := time.Now().Add(20 * time.Second)
			for {
				err, done := ended()
				if !done {
					err = d.Ready()
				}
				if err != nil && strings.Contains(err.Error(), want) {
					return err
				}
				if done || time.Now().After(deadline) {
					t.Fatalf("error %v, want one that says %q", err, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}

	for _, method := range []string{"password", "keyboard-interactive"} {
		t.Run(method, func(t *testing.T) {
			f := newFixtureWithPassphrase(t, passphraseSecret)
			twoFactorSSHDWith(t, f, method, answerSecret)
			var mu sync.Mutex
			answer, asked := answerSecret, 0
			cfg := f.config()
			cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 100*time.Millisecond
			cfg.Passphrase = func(string) ([]byte, error) { return []byte(passphraseSecret), nil }
			cfg.Ask = func(string, bool) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				asked++
				return answer, nil
			}
			t.Run("answered, and asked again on reconnection", func(t *testing.T) {
				run(t, cfg, func(d *Dialer, ended func() (error, bool)) error {
					deadline := time.Now().Add(15 * time.Second)
					restarted := false
					for {
						mu.Lock()
						n := asked
						mu.Unlock()
						if err, done := ended(); done {
							t.Fatalf("Run returned: %v", err)
						}
						switch {
						case d.Ready() == nil && !restarted:
							// A reconnection asks again: the answer was not kept to be given again.
							f.sshd.Restart()
							restarted = true
						case d.Ready() == nil && n >= 2:
							return nil
						case time.Now().After(deadline):
							t.Fatalf("not connected and reconnected within 15s (asked %d times): %v", n, d.Ready())
						}
						time.Sleep(20 * time.Millisecond)
					}
				})
			})
			t.Run("refused answers", func(t *testing.T) {
				mu.Lock()
				answer = wrongAnswerSecret
				mu.Unlock()
				run(t, cfg, failure(t, "refused the answers to "+method))
			})
		})
	}
	t.Run("wrong passphrase", func(t *testing.T) {
		f := newFixtureWithPassphrase(t, passphraseSecret)
		cfg := f.config()
		cfg.Passphrase = func(string) ([]byte, error) { return []byte(wrongPassphraseSecret), nil }
		run(t, cfg, failure(t, "wrong passphrase"))
	})
}

// TestSecretsOnTheTerminal: as a person runs konnect, at the terminal's prompts. The passphrase and the
// answer typed there show neither on the screen (no echo), where every log line at every level goes too,
// nor in the outcome.
func TestSecretsOnTheTerminal(t *testing.T) {
	for _, c := range []struct{ method, prompt string }{
		{"password", localUser() + "@127.0.0.1's password: "},
		{"keyboard-interactive", "Password: "}, // PAM's, passed on by sshd
	} {
		t.Run(c.method, func(t *testing.T) {
			f := newFixtureWithPassphrase(t, passphraseSecret)
			twoFactorSSHDWith(t, f, c.method, answerSecret)
			leader, follower := openPTY(t)
			var scr screen
			go scr.read(leader)
			result := runChildWith(t, childConfig{Destination: f.sshd.Addr(), Key: f.key, KnownHosts: f.knownHosts, Verbose: true}, follower)
			at := scr.waitFor(t, 0, "Enter passphrase for key '"+f.key+"': ")
			if _, err := leader.Write([]byte(passphraseSecret + "\n")); err != nil {
				t.Fatal(err)
			}
			scr.waitFor(t, at, c.prompt)
			if _, err := leader.Write([]byte(answerSecret + "\n")); err != nil {
				t.Fatal(err)
			}
			r := result()
			if r.Err != "" {
				t.Fatalf("konnect did not connect: %s\nterminal:\n%s\nsshd log:\n%s", r.Err, scr.String(), f.sshd.Log())
			}
			if !strings.Contains(scr.String(), "wants more; asking") {
				t.Errorf("the log does not show on the terminal, so its check proves nothing:\n%s", scr.String())
			}
			noSecret(t, "the terminal", scr.String())
		})
	}
}
