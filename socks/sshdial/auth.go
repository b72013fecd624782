package sshdial

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"
	"k8s.io/klog/v2"
)

// EncryptedKeyError is returned when an identity file needs a passphrase and there is no way to ask for it.
type EncryptedKeyError struct{ File string }

func (e *EncryptedKeyError) Error() string {
	return fmt.Sprintf("identity file %s is encrypted and there is no terminal to ask for its passphrase: "+
		"load it into ssh-agent first (ssh-add %s) or run from a terminal", e.File, e.File)
}

// AuthError is returned when the server accepted none of the offered credentials.
type AuthError struct {
	Endpoint string
	Err      error
	// Skipped lists encrypted default keys that were not offered because no passphrase could be asked for.
	Skipped []string
}

func (e *AuthError) Error() string {
	msg := fmt.Sprintf("ssh authentication to %s failed: %v", e.Endpoint, e.Err)
	if len(e.Skipped) > 0 {
		msg += fmt.Sprintf(" (encrypted keys not tried, no terminal for a passphrase: %s; load them with ssh-add)",
			strings.Join(e.Skipped, ", "))
	}
	return msg
}

func (e *AuthError) Unwrap() error { return e.Err }

// keyring loads identity files once and keeps the parsed signers, so that a reconnect does not ask for a
// passphrase again. Passphrases themselves are never stored or logged.
type keyring struct {
	passphrase func(file string) ([]byte, error)

	mu      sync.Mutex
	signers map[string]ssh.Signer // by file; nil value = absent or unusable default
	skipped map[string]bool       // encrypted defaults skipped for want of a terminal
}

func newKeyring(passphrase func(string) ([]byte, error)) *keyring {
	if passphrase == nil {
		passphrase = terminalPassphrase
	}
	return &keyring{passphrase: passphrase, signers: map[string]ssh.Signer{}, skipped: map[string]bool{}}
}

// errNoTerminal tells load that no passphrase can be asked for.
var errNoTerminal = errors.New("no terminal")

func terminalPassphrase(file string) ([]byte, error) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil, errNoTerminal
	}
	fmt.Fprintf(os.Stderr, "Enter passphrase for key '%s': ", file)
	b, err := term.ReadPassword(fd)
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("read passphrase: %w", err)
	}
	return b, nil
}

// load returns the signer for file. explicit files must exist and be usable; an absent default file yields
// (nil, nil), and an encrypted default without a terminal is recorded in skipped.
func (k *keyring) load(file string, explicit bool, pause func() (resume func())) (ssh.Signer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.signers[file]; ok {
		return s, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			k.signers[file] = nil
			return nil, nil
		}
		return nil, fmt.Errorf("identity file: %w", err)
	}
	s, err := ssh.ParsePrivateKey(pem)
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		resume := pause()
		pass, perr := k.passphrase(file)
		resume()
		if errors.Is(perr, errNoTerminal) {
			if explicit {
				return nil, &EncryptedKeyError{File: file}
			}
			k.skipped[file] = true
			return nil, nil
		}
		if perr != nil {
			return nil, fmt.Errorf("identity file %s: %w", file, perr)
		}
		s, err = ssh.ParsePrivateKeyWithPassphrase(pem, pass)
		clear(pass)
		if err != nil {
			return nil, fmt.Errorf("identity file %s: wrong passphrase or unreadable key: %w", file, err)
		}
	} else if err != nil {
		if !explicit {
			klog.V(2).InfoS("Skipping unreadable default identity file", "file", file, "err", err)
			k.signers[file] = nil
			return nil, nil
		}
		return nil, fmt.Errorf("identity file %s: %w", file, err)
	}
	k.signers[file] = s
	return s, nil
}

func (k *keyring) skippedFiles() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for f := range k.skipped {
		out = append(out, f)
	}
	return out
}

// authMethods sets up authentication for one hop: the agent's keys first, then identity files, loaded (and a
// passphrase asked for) only if the agent's keys were not enough. pause stops the handshake timeout while a
// passphrase is asked for. The returned closer releases the agent connection after the handshake.
func (d *Dialer) authMethods(cc *ssh.ClientConfig, e endpoint, pause func() (resume func())) (closer func()) {
	closer = func() {}
	files := ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
		var out []ssh.Signer
		for _, f := range append(slices.Clone(d.plan.identityFiles), e.identity...) {
			s, err := d.keys.load(f, true, pause)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		if len(d.plan.identityFiles) == 0 && len(e.identity) == 0 {
			for _, f := range d.plan.defaultIDs {
				s, err := d.keys.load(f, false, pause)
				if err != nil {
					return nil, err
				}
				if s != nil {
					out = append(out, s)
				}
			}
		}
		return out, nil
	})
	sock := d.plan.agentSocket
	if sock == "" {
		sock = os.Getenv("SSH_AUTH_SOCK")
	}
	if sock == "" || sock == "none" {
		cc.Auth = []ssh.AuthMethod{files}
		return closer
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		klog.V(1).InfoS("ssh-agent not reachable; using identity files only", "socket", sock, "err", err)
		cc.Auth = []ssh.AuthMethod{files}
		return closer
	}
	ag := agent.NewClient(c)
	cc.Auth = []ssh.AuthMethod{ssh.PublicKeysCallback(ag.Signers)}
	// The library tries each method name once; the callback adds the files as a second "publickey" round.
	filesTried := false
	cc.AuthCallback = func(ac *ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		if !filesTried && slices.Contains(ac.TriedMethods, "publickey") && slices.Contains(ac.AllowedMethods, "publickey") {
			filesTried = true
			return files, nil
		}
		return nil, nil
	}
	return func() { c.Close() }
}
