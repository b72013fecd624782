package sshdial

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"
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
	// Offered describes each identity offered: "agent key ED25519 SHA256:... (comment)" or
	// "/path/id_ed25519 (ED25519 SHA256:...)".
	Offered []string
	// Skipped lists encrypted default keys that were not offered because no passphrase could be asked for.
	Skipped []string
	// Ignored lists default keys not offered because others may read them, with their permissions.
	Ignored []string
	// WrongPassphrase lists the encrypted keys not offered because their passphrase was wrong
	// NumberOfPasswordPrompts times, as "/path/id_ed25519 (3 tries)".
	WrongPassphrase []string
	// Accepted lists the identities the server accepted while asking for more (a partial success, from
	// sshd's AuthenticationMethods): the key works, and Wanted is what the server asked for next.
	Accepted, Wanted []string
	// Answered lists the methods (password, keyboard-interactive) whose answers the server then refused.
	Answered []string
}

func (e *AuthError) Error() string {
	msg := fmt.Sprintf("ssh authentication to %s failed: ", e.Endpoint)
	switch {
	case len(e.Accepted) > 0:
		msg += fmt.Sprintf("the server accepted the key %s but requires more: %s (AuthenticationMethods)",
			strings.Join(e.Accepted, ", then "), strings.Join(e.Wanted, " / "))
		if len(e.Answered) > 0 {
			msg += "; it refused the answers to " + strings.Join(e.Answered, ", ")
		} else {
			msg += "; konnect answers only password and keyboard-interactive, unless PreferredAuthentications, " +
				"PasswordAuthentication, KbdInteractiveAuthentication, BatchMode yes or NumberOfPasswordPrompts 0 in the SSH config file exclude them"
		}
	case len(e.Offered) == 0 && len(e.WrongPassphrase) > 0:
		msg += "no identity was offered: wrong passphrase for identity file " + strings.Join(e.WrongPassphrase, ", ")
	case len(e.Offered) == 0:
		msg += "no identity was offered"
	default:
		msg += "the server accepted none of the identities offered: " + strings.Join(e.Offered, ", ")
	}
	// The library's own words name the methods the server allows.
	msg += " (" + strings.TrimPrefix(e.Err.Error(), "ssh: ") + ")"
	if len(e.WrongPassphrase) > 0 && len(e.Offered) > 0 {
		msg += "; not offered: wrong passphrase for identity file " + strings.Join(e.WrongPassphrase, ", ")
	}
	if len(e.Skipped) > 0 {
		msg += fmt.Sprintf("; encrypted keys not tried, no passphrase could be asked for (no terminal, or BatchMode yes or NumberOfPasswordPrompts 0): %s (load them with ssh-add)",
			strings.Join(e.Skipped, ", "))
	}
	if len(e.Ignored) > 0 {
		msg += "; ignored, open to others: " + strings.Join(e.Ignored, ", ")
	}
	return msg
}

func (e *AuthError) Unwrap() error { return e.Err }

// NoIdentityError is returned by New when a hop has nothing to authenticate with: no identity file, no key
// in ssh-agent. The server could only refuse, so the start fails instead.
type NoIdentityError struct {
	Endpoint string
	Looked   []string // where identities were looked for, and why each gave none
}

func (e *NoIdentityError) Error() string {
	return fmt.Sprintf("no SSH identity to offer %s: %s; pass -i FILE or load a key into ssh-agent with ssh-add",
		e.Endpoint, strings.Join(e.Looked, ", "))
}

// UnprotectedKeyError is an identity file of the running user's that group or others may access. OpenSSH
// refuses such a key (and ignores key files owned by other users, whatever their mode); so does konnect,
// unless asked not to.
type UnprotectedKeyError struct {
	File string
	Mode fs.FileMode // permission bits
}

func (e *UnprotectedKeyError) Error() string { return e.Named(fieldName) }

// Named is Error with the Config field that allows the key (AllowUnprotectedKeys) spelled as name returns
// it: a command names its flag (cmd/internal/flagerr).
func (e *UnprotectedKeyError) Named(name func(field string) string) string {
	return fmt.Sprintf("UNPROTECTED PRIVATE KEY FILE: permissions %04o for identity file %s are too open: a private key "+
		"must not be accessible by others; run chmod 600 %s, or pass %s", e.Mode.Perm(), e.File, e.File, name("AllowUnprotectedKeys"))
}

// fieldName spells a Config field by its own name, for Error.
func fieldName(field string) string { return field }

// checkKeyPermissions refuses, as OpenSSH's sshkey_perm_ok does, a key file owned by the running user that
// group or others have any access to. A file owned by someone else (root's key read by root's service,
// another user's shared key) is not the user's to fix and passes.
func checkKeyPermissions(file string, allowOpen bool) error {
	fi, err := os.Stat(file)
	if err != nil {
		return fmt.Errorf("identity file: %w", err)
	}
	// The real user id, the one OpenSSH compares a key file's owner with.
	if allowOpen || !safepath.OpenToOthers(fi, os.Getuid()) {
		return nil
	}
	return &UnprotectedKeyError{File: file, Mode: fi.Mode().Perm()}
}

// keyring loads identity files once and keeps the parsed signers, so that a reconnect does not ask for a
// passphrase again. A key whose passphrase was wrong NumberOfPasswordPrompts times is given up on for the
// run, as OpenSSH gives up on it for the login. Passphrases themselves are never stored or logged.
type keyring struct {
	passphrase func(file string) ([]byte, error)
	onTerminal bool // passphrase asks on the terminal
	allowOpen  bool
	log        logr.Logger

	mu      sync.Mutex
	signers map[string]ssh.Signer // by file; nil value = absent or unusable default
	skipped map[string]bool       // encrypted defaults skipped for want of a terminal
	ignored map[string]string     // default keys open to others: file -> "FILE (permissions 0644)"
	wrong   map[string]int        // wrong passphrases given so far, by file
	gaveUp  map[string]string     // keys given up on: file -> "FILE (3 tries)"
}

func newKeyring(passphrase func(string) ([]byte, error), allowOpen bool, log logr.Logger) *keyring {
	onTerminal := passphrase == nil
	if onTerminal {
		passphrase = terminalPassphrase
	}
	return &keyring{passphrase: passphrase, onTerminal: onTerminal, allowOpen: allowOpen, log: log,
		signers: map[string]ssh.Signer{}, skipped: map[string]bool{}, ignored: map[string]string{},
		wrong: map[string]int{}, gaveUp: map[string]string{}}
}

// errNoTerminal tells load that no passphrase can be asked for.
var errNoTerminal = errors.New("no terminal")

func terminalPassphrase(file string) ([]byte, error) {
	b, err := readTerminal(fmt.Sprintf("Enter passphrase for key '%s': ", file), false)
	if err != nil && !errors.Is(err, errNoTerminal) {
		return nil, fmt.Errorf("read passphrase: %w", err)
	}
	return b, err
}

// haveTerminal reports whether stdin is a terminal a person can answer on.
func haveTerminal() bool { return term.IsTerminal(int(os.Stdin.Fd())) }

// readTerminal shows prompt on stderr and reads one line from stdin, which must be a terminal, without
// echo unless echo is set, as OpenSSH's read_passphrase does.
func readTerminal(prompt string, echo bool) ([]byte, error) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil, errNoTerminal
	}
	if !echo {
		restore, err := noEcho(fd)
		if errors.Is(err, errors.ErrUnsupported) {
			fmt.Fprint(os.Stderr, prompt)
			b, err := term.ReadPassword(fd)
			fmt.Fprintln(os.Stderr)
			return b, err
		}
		if err != nil {
			return nil, err
		}
		defer func() {
			restore()
			fmt.Fprintln(os.Stderr) // the line the answer was typed on, which showed nothing
		}()
	}
	fmt.Fprint(os.Stderr, prompt)
	// Byte by byte, so that nothing after the line is consumed.
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := os.Stdin.Read(b)
		switch {
		case n == 1 && b[0] == '\n', err == io.EOF && len(line) > 0:
			return bytes.TrimSuffix(line, []byte("\r")), nil
		case n == 1:
			line = append(line, b[0])
		case err != nil:
			clear(line)
			return nil, err
		}
	}
}

// keySource says where an identity file was named, which decides what a missing or unsafe file means.
type keySource int

const (
	fromFlag    keySource = iota // -i: must exist and be usable
	fromConfig                   // ssh_config IdentityFile: may be absent, as OpenSSH skips it
	fromDefault                  // ~/.ssh/id_*: may be absent, unusable or unsafe, and is then skipped
)

// load returns the signer for file, or (nil, nil) for a file that src allows to be skipped. An encrypted
// default without a terminal is recorded in skipped, an unsafe default in ignored. An encrypted key's
// passphrase is asked for up to tries times (NumberOfPasswordPrompts) in all while it is wrong; then the key,
// whatever src, is skipped as OpenSSH skips it, and recorded in gaveUp. The end of ctx ends the wait for a
// passphrase (see answer).
func (k *keyring) load(ctx context.Context, file string, src keySource, tries int, pause func() (resume func())) (ssh.Signer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.signers[file]; ok {
		return s, nil
	}
	if err := checkKeyPermissions(file, k.allowOpen); err != nil {
		var open *UnprotectedKeyError
		switch {
		case src != fromFlag && errors.Is(err, os.ErrNotExist):
			k.signers[file] = nil
			return nil, nil
		case src == fromDefault && errors.As(err, &open):
			// OpenSSH's words, once: the key is skipped, as OpenSSH skips it.
			k.log.Info("Ignoring an identity file that others may read (UNPROTECTED PRIVATE KEY FILE); run chmod 600 on it",
				"file", file, "permissions", fmt.Sprintf("%04o", open.Mode))
			k.ignored[file] = fmt.Sprintf("%s (permissions %04o)", file, open.Mode)
			k.signers[file] = nil
			return nil, nil
		}
		return nil, err
	}
	pem, err := smallfile.Read(file)
	if err != nil {
		return nil, fmt.Errorf("identity file: %w", err)
	}
	s, err := ssh.ParsePrivateKey(pem)
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		s, err = k.decrypt(ctx, file, src, pem, tries, pause)
		if s == nil {
			return nil, err
		}
	} else if err != nil {
		if src == fromDefault {
			k.log.V(2).Info("Skipping unreadable default identity file", "file", file, "err", err)
			k.signers[file] = nil
			return nil, nil
		}
		return nil, fmt.Errorf("identity file %s: %w", file, err)
	}
	k.signers[file] = s
	return s, nil
}

// decrypt asks for file's passphrase and decrypts pem with it, asking again while the passphrase is wrong,
// up to tries times for file in all. It returns (nil, nil) for a key to skip: an encrypted default with no
// terminal, or a key whose passphrase was wrong tries times. k.mu is held.
func (k *keyring) decrypt(ctx context.Context, file string, src keySource, pem []byte, tries int, pause func() (resume func())) (ssh.Signer, error) {
	if tries == 0 {
		// NumberOfPasswordPrompts 0 or BatchMode yes: ssh asks for no passphrase and goes on without the
		// key, whatever named it. Only for this hop: another hop's settings may allow the prompt, so the
		// key is not given up on.
		if !k.skipped[file] {
			k.log.Info("Identity file not offered: it is encrypted, and the SSH config file allows no prompt (BatchMode yes or NumberOfPasswordPrompts 0); load it with ssh-add",
				"file", file)
		}
		k.skipped[file] = true
		return nil, nil
	}
	for k.wrong[file] < tries {
		resume := pause()
		pass, err := answer(ctx, k.onTerminal, func() ([]byte, error) { return k.passphrase(file) })
		resume()
		if errors.Is(err, errNoTerminal) {
			if src != fromDefault {
				return nil, &EncryptedKeyError{File: file}
			}
			k.skipped[file] = true
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("identity file %s: %w", file, err)
		}
		s, err := ssh.ParsePrivateKeyWithPassphrase(pem, pass)
		clear(pass)
		switch {
		case err == nil:
			return s, nil
		case !errors.Is(err, x509.IncorrectPasswordError):
			return nil, fmt.Errorf("identity file %s: unreadable key: %w", file, err)
		}
		k.wrong[file]++
		if k.wrong[file] < tries {
			k.log.Info("Wrong passphrase for an identity file; asking again", "file", file, "try", k.wrong[file], "tries", tries)
		}
	}
	// OpenSSH's load_identity_file gives up on the key after NumberOfPasswordPrompts wrong passphrases and
	// goes on with the next identity; so does konnect, for the rest of the run.
	k.log.Info("Identity file not offered: wrong passphrase; skipping it, as ssh does after NumberOfPasswordPrompts tries",
		"file", file, "tries", k.wrong[file])
	n := fmt.Sprintf("%d tries", k.wrong[file])
	if k.wrong[file] == 1 {
		n = "1 try"
	}
	k.gaveUp[file] = fmt.Sprintf("%s (%s)", file, n)
	k.signers[file] = nil
	return nil, nil
}

// gaveUpFiles, skippedFiles and ignoredFiles list, sorted, the keys not offered and why, for AuthError.
func (k *keyring) gaveUpFiles() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Values(k.gaveUp))
}

func (k *keyring) skippedFiles() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.skipped))
}

func (k *keyring) ignoredFiles() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Values(k.ignored))
}

// describeKey is how an offered identity is named in errors: type, SHA256 fingerprint and comment, the way
// ssh-add -l shows them.
func describeKey(k ssh.PublicKey, comment string) string {
	d := keyTypeName(k) + " " + ssh.FingerprintSHA256(k)
	if comment != "" {
		d += " (" + comment + ")"
	}
	return d
}

// agentSocketPath is the ssh-agent socket hop e uses, or "" for none: Config.AgentSocket, else the config
// file's IdentityAgent, else $SSH_AUTH_SOCK. As in OpenSSH, IdentityAgent SSH_AUTH_SOCK or $VAR names an
// environment variable.
func (d *Dialer) agentSocketPath(e endpoint) string {
	sock := d.plan.agentSocket
	if sock == "" {
		sock = e.identityAgent
	}
	switch {
	case sock == "" || sock == "SSH_AUTH_SOCK":
		sock = os.Getenv("SSH_AUTH_SOCK")
	case strings.HasPrefix(sock, "$"):
		sock = os.Getenv(sock[1:])
	}
	if sock == "none" {
		return ""
	}
	return sock
}

// publicKeys returns the public keys of the identity files (from FILE.pub, or from the private key, whose
// OpenSSH format carries the public key in the clear even when encrypted), marshalled: IdentitiesOnly lets
// the agent sign with these alone, as OpenSSH does.
func publicKeys(files []string) map[string]bool {
	out := map[string]bool{}
	for _, f := range files {
		if b, err := smallfile.Read(f + ".pub"); err == nil {
			if k, _, _, _, err := ssh.ParseAuthorizedKey(b); err == nil {
				out[string(k.Marshal())] = true
				continue
			}
		}
		b, err := smallfile.Read(f)
		if err != nil {
			continue
		}
		s, err := ssh.ParsePrivateKey(b)
		var missing *ssh.PassphraseMissingError
		switch {
		case err == nil:
			out[string(s.PublicKey().Marshal())] = true
		case errors.As(err, &missing) && missing.PublicKey != nil:
			out[string(missing.PublicKey.Marshal())] = true
		}
	}
	return out
}

// identityFiles returns the files hop e offers, in order, with where each was named.
func (d *Dialer) identityFiles(e endpoint) (files []string, src []keySource) {
	for _, f := range d.plan.identityFiles {
		files, src = append(files, f), append(src, fromFlag)
	}
	for _, f := range e.identity {
		files, src = append(files, f), append(src, fromConfig)
	}
	// As OpenSSH: the default files only when neither -i nor the config file names one.
	if len(files) == 0 {
		for _, f := range d.plan.defaultIDs {
			files, src = append(files, f), append(src, fromDefault)
		}
	}
	return files, src
}

// authMethods sets up authentication for one hop: the agent's keys first, then identity files, loaded (and a
// passphrase asked for) only if the agent's keys were not enough, then, if the server accepted a key but
// wants more, password and keyboard-interactive. pause stops the handshake timeout while a person is asked;
// the end of ctx ends the asking. The returned closer releases the agent connection after the handshake;
// run knows what was offered and accepted, for AuthError.
func (d *Dialer) authMethods(ctx context.Context, cc *ssh.ClientConfig, e endpoint, pause func() (resume func())) (closer func(), run *authRun) {
	closer = func() {}
	run = &authRun{d: d, ctx: ctx, hop: e, pause: pause}
	defer func() { cc.AuthCallback = run.then(cc.AuthCallback) }()
	files := ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
		var keys []ssh.Signer
		var keyFiles []string  // keys[i]'s file: names skips the files that gave no key
		var certs []ssh.Signer // after keys, each plain key's FILE-cert.pub
		names, srcs := d.identityFiles(e)
		for i, f := range names {
			s, err := d.keys.load(ctx, f, srcs[i], e.auth.passwordPrompts, pause)
			if err != nil {
				return nil, err
			}
			if s == nil {
				continue
			}
			keys, keyFiles = append(keys, s), append(keyFiles, f)
			certs = append(certs, nil)
			if c := d.certificate(f+"-cert.pub", false); c != nil {
				certs[len(certs)-1] = d.certSigner(f+"-cert.pub", c, s)
			}
		}
		// OpenSSH's order: CertificateFile certificates first, then each key followed by its FILE-cert.pub.
		var out []ssh.Signer
		offer := func(file string, s ssh.Signer) {
			out = append(out, run.record(s, file+" ("+describeKey(s.PublicKey(), "")+")"))
		}
		for _, cf := range e.certificates {
			c := d.certificate(cf, true)
			if c == nil {
				continue
			}
			i := slices.IndexFunc(keys, func(s ssh.Signer) bool { return bytes.Equal(s.PublicKey().Marshal(), c.Key.Marshal()) })
			if i < 0 {
				d.log.Info("Ignoring a CertificateFile whose key is none of the identity files'", "file", cf)
				continue
			}
			if cs := d.certSigner(cf, c, keys[i]); cs != nil {
				offer(cf, cs)
			}
		}
		for i, s := range keys {
			offer(keyFiles[i], s)
			if certs[i] != nil {
				offer(keyFiles[i]+"-cert.pub", certs[i])
			}
		}
		return out, nil
	})
	sock := d.agentSocketPath(e)
	if sock == "" {
		cc.Auth = []ssh.AuthMethod{files}
		return closer, run
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		d.log.V(1).Info("ssh-agent not reachable; using identity files only", "socket", sock, "err", err)
		cc.Auth = []ssh.AuthMethod{files}
		return closer, run
	}
	ag := agent.NewClient(c)
	cc.Auth = []ssh.AuthMethod{ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
		signers, err := ag.Signers()
		if err != nil {
			return nil, err
		}
		if e.identitiesOnly {
			names, _ := d.identityFiles(e)
			own := publicKeys(names)
			signers = slices.DeleteFunc(signers, func(s ssh.Signer) bool { return !own[string(s.PublicKey().Marshal())] })
		}
		comments := map[string]string{}
		if keys, err := ag.List(); err == nil {
			for _, k := range keys {
				comments[string(k.Marshal())] = k.Comment
			}
		}
		for i, s := range signers {
			signers[i] = run.record(s, "agent key "+describeKey(s.PublicKey(), comments[string(s.PublicKey().Marshal())]))
		}
		return signers, nil
	})}
	// The library tries each method name once; the callback adds the files as a second "publickey" round.
	filesTried := false
	cc.AuthCallback = func(ac *ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		if !filesTried && slices.Contains(ac.TriedMethods, "publickey") && slices.Contains(ac.AllowedMethods, "publickey") {
			filesTried = true
			return files, nil
		}
		return nil, nil
	}
	return func() { c.Close() }, run
}

// certificate reads a user certificate, or returns nil when there is none to use: absent (a CertificateFile,
// named explicitly, is worth a line then), unreadable or no certificate, which OpenSSH skips as well.
func (d *Dialer) certificate(file string, named bool) *ssh.Certificate {
	b, err := smallfile.Read(file)
	if errors.Is(err, os.ErrNotExist) && !named {
		return nil
	}
	if err != nil {
		d.log.Info("Ignoring a certificate file that cannot be read", "file", file, "err", err)
		return nil
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	c, ok := k.(*ssh.Certificate)
	if err != nil || !ok || c.CertType != ssh.UserCert {
		d.log.Info("Ignoring a certificate file that holds no user certificate", "file", file, "err", err)
		return nil
	}
	return c
}

// certSigner signs with key under certificate c, or returns nil (and says why) when c is not key's.
func (d *Dialer) certSigner(file string, c *ssh.Certificate, key ssh.Signer) ssh.Signer {
	cs, err := ssh.NewCertSigner(c, key)
	if err != nil {
		d.log.Info("Ignoring a certificate that is not for its identity file's key", "file", file, "err", err)
		return nil
	}
	return cs
}

// checkIdentities fails when a hop has no identity at all to offer: no -i, no IdentityFile that exists, no
// default key that may be used, and no key in ssh-agent. The server could only refuse, and retrying would not
// change that. It reads the files' metadata and asks the agent for its list; it does not connect.
func (d *Dialer) checkIdentities() error {
	if len(d.plan.identityFiles) > 0 {
		return nil // -i applies to every hop, and resolve checked each file
	}
hops:
	for _, h := range d.plan.hops {
		var agentNote string
		if sock := d.agentSocketPath(h); sock == "" {
			agentNote = "no ssh-agent ($SSH_AUTH_SOCK is not set, or IdentityAgent is none)"
		} else if c, err := net.Dial("unix", sock); err != nil {
			agentNote = fmt.Sprintf("no ssh-agent at %s (%v)", sock, err)
		} else {
			keys, err := agent.NewClient(c).List()
			c.Close()
			if err == nil && len(keys) > 0 {
				continue
			}
			agentNote = fmt.Sprintf("no key in the ssh-agent at %s", sock)
		}
		names, srcs := d.identityFiles(h)
		var absent, open []string
		for i, f := range names {
			err := checkKeyPermissions(f, d.plan.allowOpenKeys)
			var uk *UnprotectedKeyError
			switch {
			case err == nil:
				continue hops
			case errors.As(err, &uk) && srcs[i] == fromDefault:
				open = append(open, fmt.Sprintf("%s (permissions %04o, ignored as OpenSSH ignores it)", f, uk.Mode))
			case errors.Is(err, os.ErrNotExist):
				absent = append(absent, f)
			default:
				return err
			}
		}
		looked := []string{"no -i", agentNote}
		if len(absent) > 0 {
			looked = append(looked, "no file "+strings.Join(absent, ", "))
		}
		looked = append(looked, open...)
		return &NoIdentityError{Endpoint: h.String(), Looked: looked}
	}
	return nil
}
