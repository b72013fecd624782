package sshdial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/term"
)

// A server may accept a key and still ask for more: sshd's "AuthenticationMethods publickey,password" (or
// publickey,keyboard-interactive) answers the key with a partial success. konnect then goes on with
// keyboard-interactive and password, asking a person on the terminal as OpenSSH does. It offers them only
// after a partial success: a refused key stays an AuthError instead of turning into a password prompt.

// authSettings are the ssh_config settings that choose the methods that follow a key.
type authSettings struct {
	preferred       []string // PreferredAuthentications, in order
	kbdInteractive  bool     // KbdInteractiveAuthentication (ChallengeResponseAuthentication)
	password        bool     // PasswordAuthentication
	passwordPrompts int      // NumberOfPasswordPrompts: tries of each method, and of each key's passphrase; 0 (or BatchMode yes) asks nothing
}

// opensshPreferred is OpenSSH's default PreferredAuthentications.
var opensshPreferred = []string{"gssapi-with-mic", "hostbased", "publickey", "keyboard-interactive", "password"}

// readAuthSettings reads hop alias's authentication settings from the config file, with OpenSSH's
// defaults.
func readAuthSettings(hc *hostSettings, alias string) (authSettings, error) {
	s := authSettings{preferred: opensshPreferred, kbdInteractive: true, password: true, passwordPrompts: 3}
	if v := hc.get("PreferredAuthentications"); v != "" {
		s.preferred = strings.Split(v, ",")
	}
	yesNo := func(key string, dst *bool) error {
		_, v, file, line := hc.first(key)
		switch strings.ToLower(v) {
		case "":
		case "yes":
			*dst = true
		case "no":
			*dst = false
		default:
			return fmt.Errorf("ssh config %s line %d: %s for %s: %q is neither yes nor no", file, line, key, alias, v)
		}
		return nil
	}
	for _, key := range []string{"ChallengeResponseAuthentication", "KbdInteractiveAuthentication"} {
		if err := yesNo(key, &s.kbdInteractive); err != nil {
			return s, err
		}
	}
	if err := yesNo("PasswordAuthentication", &s.password); err != nil {
		return s, err
	}
	if _, v, file, line := hc.first("NumberOfPasswordPrompts"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return s, fmt.Errorf("ssh config %s line %d: NumberOfPasswordPrompts for %s: %q is not a number of 0 or more", file, line, alias, v)
		}
		s.passwordPrompts = n
	}
	// BatchMode yes is ssh's setting for scripts: no prompt of any kind. konnect asks no host key question
	// either way, so what is left of it is what NumberOfPasswordPrompts 0 does.
	var batch bool
	if err := yesNo("BatchMode", &batch); err != nil {
		return s, err
	}
	if batch {
		s.passwordPrompts = 0
	}
	return s, nil
}

// enabled reports whether the config file lets konnect answer method (a person answers: password or
// keyboard-interactive).
func (s authSettings) enabled(method string) bool {
	if s.passwordPrompts == 0 { // as ssh: NumberOfPasswordPrompts 0 and BatchMode yes ask nothing
		return false
	}
	switch method {
	case "password":
		return s.password
	case "keyboard-interactive":
		return s.kbdInteractive
	}
	return false
}

// InteractiveAuthError is a server that accepted a key and wants a password or keyboard-interactive
// answers, with no terminal to ask a person on (konnect runs as a service, stdin is not a terminal). Before
// any connection was up it ends Run; afterwards each reconnection attempt fails with it, and is retried.
type InteractiveAuthError struct {
	Endpoint string
	Accepted []string // the identities the server accepted
	Methods  []string // what the server wants next
}

func (e *InteractiveAuthError) Error() string {
	return fmt.Sprintf("ssh authentication to %s: the server accepted the key %s but requires more: %s "+
		"(AuthenticationMethods), and there is no terminal to ask for it: run konnect from a terminal, or have "+
		"sshd accept the key alone for this user", e.Endpoint, strings.Join(e.Accepted, ", then "), strings.Join(e.Methods, " / "))
}

// askMu keeps two connections from asking on the one terminal at once.
var askMu sync.Mutex

// authRun is the authentication of one handshake: what was offered, which key the server accepted as a
// partial success, and the methods that follow.
type authRun struct {
	d     *Dialer
	ctx   context.Context
	hop   endpoint
	pause func() (resume func())

	offered  []string // every identity offered
	signed   string   // the identity last signed with: the one the server's answer is about
	accepted []string // identities the server accepted while asking for more
	wanted   []string // what the server asked for after the last partial success
	asked    []string // password / keyboard-interactive methods konnect went on with
	partials int      // partial successes seen
	askErr   error    // why a question got no answer: no further method is tried
}

func (r *authRun) note(what string) {
	if !slices.Contains(r.offered, what) {
		r.offered = append(r.offered, what)
	}
}

// record wraps s so that a signature with it marks it as the identity the server's answer is about. The
// wrapper has the same signing interfaces as s, which decide the signature algorithms the library picks.
func (r *authRun) record(s ssh.Signer, what string) ssh.Signer {
	r.note(what)
	mark := func() { r.signed = what }
	switch s := s.(type) {
	case ssh.MultiAlgorithmSigner:
		return &recordingMultiSigner{s, mark}
	case ssh.AlgorithmSigner:
		return &recordingAlgorithmSigner{s, mark}
	default:
		return &recordingSigner{s, mark}
	}
}

type recordingSigner struct {
	ssh.Signer
	mark func()
}

func (s *recordingSigner) Sign(rand io.Reader, data []byte) (*ssh.Signature, error) {
	s.mark()
	return s.Signer.Sign(rand, data)
}

type recordingAlgorithmSigner struct {
	ssh.AlgorithmSigner
	mark func()
}

func (s *recordingAlgorithmSigner) Sign(rand io.Reader, data []byte) (*ssh.Signature, error) {
	s.mark()
	return s.AlgorithmSigner.Sign(rand, data)
}

func (s *recordingAlgorithmSigner) SignWithAlgorithm(rand io.Reader, data []byte, algorithm string) (*ssh.Signature, error) {
	s.mark()
	return s.AlgorithmSigner.SignWithAlgorithm(rand, data, algorithm)
}

type recordingMultiSigner struct {
	ssh.MultiAlgorithmSigner
	mark func()
}

func (s *recordingMultiSigner) Sign(rand io.Reader, data []byte) (*ssh.Signature, error) {
	s.mark()
	return s.MultiAlgorithmSigner.Sign(rand, data)
}

func (s *recordingMultiSigner) SignWithAlgorithm(rand io.Reader, data []byte, algorithm string) (*ssh.Signature, error) {
	s.mark()
	return s.MultiAlgorithmSigner.SignWithAlgorithm(rand, data, algorithm)
}

// then wraps the handshake's AuthCallback (prev, which may be nil): after a partial success it picks the
// next method the server allows, in PreferredAuthentications order, and answers password and
// keyboard-interactive itself. Other methods, publickey again included, are left to the library.
func (r *authRun) then(prev func(*ssh.ClientAuthContext) (ssh.AuthMethod, error)) func(*ssh.ClientAuthContext) (ssh.AuthMethod, error) {
	return func(ac *ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		if n := len(ac.PartialSuccessMethods); n > r.partials {
			r.partials = n
			r.wanted = slices.Clone(ac.AllowedMethods)
			if ac.PartialSuccessMethods[n-1] == "publickey" && r.signed != "" {
				r.accepted = append(r.accepted, r.signed)
			}
		}
		if r.askErr != nil {
			return nil, r.askErr
		}
		if prev != nil {
			if m, err := prev(ac); m != nil || err != nil {
				return m, err
			}
		}
		if r.partials == 0 {
			return nil, nil
		}
		for _, m := range r.hop.auth.preferred {
			if !slices.Contains(ac.AllowedMethods, m) || slices.Contains(ac.TriedMethods, m) || slices.Contains(r.asked, m) {
				continue
			}
			if m == "publickey" {
				return nil, nil // the library's own methods
			}
			if !r.hop.auth.enabled(m) {
				continue
			}
			if r.d.plan.ask == nil && !haveTerminal() {
				return nil, &InteractiveAuthError{Endpoint: r.hop.String(), Accepted: r.accepted, Methods: r.interactive(ac.AllowedMethods)}
			}
			r.asked = append(r.asked, m)
			r.d.log.V(1).Info("The SSH server accepted the key and wants more; asking", "target", r.hop.String(), "method", m)
			return r.method(m), nil
		}
		return nil, nil
	}
}

// interactive is the methods in allowed that a person would answer, or all of allowed if none.
func (r *authRun) interactive(allowed []string) []string {
	out := slices.DeleteFunc(slices.Clone(allowed), func(m string) bool { return m != "password" && m != "keyboard-interactive" })
	if len(out) == 0 {
		return allowed
	}
	return out
}

// method is the AuthMethod for password or keyboard-interactive, with OpenSSH's prompts and its
// NumberOfPasswordPrompts tries.
func (r *authRun) method(name string) ssh.AuthMethod {
	tries := r.hop.auth.passwordPrompts
	if name == "password" {
		host := r.hop.hostName
		if r.hop.hostKeyAlias != "" {
			host = r.hop.hostKeyAlias
		}
		attempt := 0
		return ssh.RetryableAuthMethod(ssh.PasswordCallback(func() (string, error) {
			attempt++
			q := fmt.Sprintf("%s@%s's password: ", r.hop.user, host)
			if attempt > 1 {
				q = "Permission denied, please try again.\n" + q
			}
			return r.ask(q, false)
		}), tries)
	}
	return ssh.RetryableAuthMethod(ssh.KeyboardInteractive(func(name, instruction string, questions []string, echos []bool) ([]string, error) {
		// OpenSSH shows the server's name and instruction, each on a line of its own, before its prompts.
		var header string
		for _, s := range []string{name, instruction} {
			if s != "" {
				header += strings.TrimRight(s, "\n") + "\n"
			}
		}
		if len(questions) == 0 && header != "" && r.d.plan.ask == nil {
			fmt.Fprint(os.Stderr, header)
		}
		answers := make([]string, len(questions))
		for i, q := range questions {
			if i == 0 {
				q = header + q
			}
			a, err := r.ask(q, echos[i])
			if err != nil {
				return nil, err
			}
			answers[i] = a
		}
		return answers, nil
	}), tries)
}

// ask puts question to a person: Config.Ask, else the terminal. The handshake timeout stops meanwhile, and
// the end of ctx (konnect stopping) ends the wait (see answer).
func (r *authRun) ask(question string, echo bool) (a string, err error) {
	defer func() {
		if err != nil {
			r.askErr = err
		}
	}()
	resume := r.pause()
	defer resume()
	askMu.Lock()
	defer askMu.Unlock()
	custom := r.d.plan.ask
	read := func() ([]byte, error) { return readTerminal(question, echo) }
	if custom != nil {
		read = func() ([]byte, error) {
			a, err := custom(question, echo)
			return []byte(a), err
		}
	}
	b, err := answer(r.ctx, custom == nil, read)
	switch {
	case errors.Is(err, errNoTerminal):
		return "", &InteractiveAuthError{Endpoint: r.hop.String(), Accepted: r.accepted, Methods: r.interactive(r.wanted)}
	case err != nil && custom == nil && r.ctx.Err() == nil:
		return "", fmt.Errorf("read answer for %s: %w", r.hop, err)
	case err != nil:
		return "", err
	}
	s := string(b)
	clear(b)
	return s, nil
}

// answer returns what read, a question put to a person, answers, or ctx's error as soon as ctx ends:
// konnect stopping (SIGTERM, Ctrl-C) must not wait for someone who does not answer. read is then left to
// finish in the background, and an answer that comes after all is wiped. onTerminal says read asks on the
// terminal, whose settings (echo) are then put back, and the prompt's line ended.
func answer(ctx context.Context, onTerminal bool, read func() ([]byte, error)) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fd := int(os.Stdin.Fd())
	var state *term.State
	if onTerminal {
		state, _ = term.GetState(fd)
	}
	type result struct {
		b   []byte
		err error
	}
	got := make(chan result)
	abandoned := make(chan struct{})
	go func() {
		b, err := read()
		select {
		case got <- result{b, err}:
		case <-abandoned:
			clear(b)
		}
	}()
	select {
	case r := <-got:
		return r.b, r.err
	case <-ctx.Done():
		close(abandoned)
		if state != nil {
			_ = term.Restore(fd, state)
			fmt.Fprintln(os.Stderr)
		}
		return nil, ctx.Err()
	}
}

// authError is the AuthError for a refused login.
func (r *authRun) authError(cause error) *AuthError {
	e := &AuthError{Endpoint: r.hop.String(), Err: cause, Offered: r.offered,
		Skipped: r.d.keys.skippedFiles(), Ignored: r.d.keys.ignoredFiles(), WrongPassphrase: r.d.keys.gaveUpFiles()}
	if len(r.accepted) > 0 {
		e.Accepted, e.Wanted, e.Answered = r.accepted, r.wanted, r.asked
	}
	return e
}

// unaskable reports an InteractiveAuthError before any connection was up: nobody will be there to answer
// the next attempt either, so Run ends. Once a connection has been up, each attempt fails and is retried.
func (d *Dialer) unaskable(err error) bool {
	var ie *InteractiveAuthError
	if !errors.As(err, &ie) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.wasUp
}
