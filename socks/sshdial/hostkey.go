package sshdial

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyError is returned when a host key is not trusted: the host is unknown, or its key changed (or is
// revoked). There is deliberately no way to skip this check.
type HostKeyError struct {
	Host           string // the known_hosts name, e.g. "bastion" or "[10.0.0.1]:2222"
	KnownHostsFile string // where a new key is recorded: the first user known_hosts file
	KeyType        string
	Fingerprint    string // SHA256:...
	// Line is the exact known_hosts line that trusts the presented key.
	Line string
	// Changed is set when a known_hosts file holds other keys for Host; Known lists them ("file:line"),
	// KnownFiles the files that hold them.
	Changed    bool
	Revoked    bool
	Known      []string
	KnownFiles []string
	// Unrecorded is why AcceptNew did not record an unknown host's key: the file is one another user
	// could redirect (wraps safepath.ErrShared). Retrying cannot help, so the host is not trusted.
	Unrecorded error
}

func (e *HostKeyError) Error() string { return e.Named(fieldName) }

// Named is Error with the Config field that records unknown keys (AcceptNew) spelled as name returns it.
func (e *HostKeyError) Named(name func(field string) string) string {
	switch {
	case e.Revoked:
		return fmt.Sprintf("host key for %s (%s %s) is marked @revoked in a known_hosts file; refusing to connect",
			e.Host, e.KeyType, e.Fingerprint)
	case e.Changed:
		var fix []string
		for _, f := range e.KnownFiles {
			fix = append(fix, fmt.Sprintf("ssh-keygen -R '%s' -f %s", e.Host, f))
		}
		return fmt.Sprintf("WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED for %s. It now presents %s %s, "+
			"which does not match the key recorded at %s. Someone could be eavesdropping on you right now "+
			"(man-in-the-middle attack), or the host key has just been changed. Refusing to connect. "+
			"If the change is expected, remove the old entry with: %s",
			e.Host, e.KeyType, e.Fingerprint, strings.Join(e.Known, ", "), strings.Join(fix, "; "))
	case e.Unrecorded != nil:
		return fmt.Sprintf("host key for %s is not known: %s %s, and %s cannot record it: %v",
			e.Host, e.KeyType, e.Fingerprint, name("AcceptNew"), e.Unrecorded)
	default:
		return fmt.Sprintf("host key for %s is not known: %s %s. Verify this fingerprint with the server's "+
			"administrator, then add this line to %s (or run once with %s):\n%s",
			e.Host, e.KeyType, e.Fingerprint, e.KnownHostsFile, name("AcceptNew"), e.Line)
	}
}

func (e *HostKeyError) Unwrap() error { return e.Unrecorded }

// knownHosts checks host keys against the known_hosts files, as OpenSSH does: a key that any file records for
// the host is known; a host that some file records with other keys only has changed keys, even if a new key
// would be recorded; a key @revoked in any file is refused. With acceptNew, unknown hosts are appended to the
// first user file.
type knownHosts struct {
	files     []string // UserKnownHostsFile; the first records new keys
	global    []string // GlobalKnownHostsFile, read only
	acceptNew bool
	log       logr.Logger
	mu        sync.Mutex // serialises reading against appending
}

// recordFile is where new host keys go, "" when UserKnownHostsFile is none.
func (k *knownHosts) recordFile() string {
	if len(k.files) == 0 {
		return ""
	}
	return k.files[0]
}

// hostDB is one reading of the known_hosts files: knownhosts for plain host keys, and the @cert-authority and
// @revoked lines matched as OpenSSH matches them.
type hostDB struct {
	plain       ssh.HostKeyCallback
	authorities authorities
	// shown maps the copy knownhosts read of a file with lines it cannot parse back to the file's name.
	shown map[string]string
}

// name is the file a knownhosts.KnownKey came from.
func (db *hostDB) name(file string) string {
	if n, ok := db.shown[file]; ok {
		return n
	}
	return file
}

// maxKnownHostsSize bounds a known_hosts file: far above a fleet-wide ssh_known_hosts (50,000 hosts with
// three keys each is about 30 MiB), and still a bound for a file that is wrong.
const maxKnownHostsSize = 256 << 20

// load reads the files afresh, so entries added since (by us or by ssh) are seen. A missing file is empty.
func (k *knownHosts) load() (*hostDB, error) {
	db := &hostDB{authorities: newAuthorities(), shown: map[string]string{}}
	var paths []string
	for _, f := range slices.Concat(k.files, k.global) {
		data, err := smallfile.ReadUpTo(f, maxKnownHostsSize)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("known_hosts %s: %w", f, err)
		}
		path := f
		// knownhosts refuses the whole file for one line it cannot parse (a key type it does not know, such as
		// XMSS); OpenSSH skips such a line, and so does this. knownhosts also matches host names case by case,
		// where OpenSSH matches them in lower case (match_hostname): "MyHost" names myhost.
		if _, err := knownhosts.New(f); err != nil || hasUpperHostPattern(data) {
			if path, err = k.parsableCopy(f, data); err != nil {
				return nil, fmt.Errorf("known_hosts %s: %w", f, err)
			}
			defer os.Remove(path)
			db.shown[path] = f
		}
		paths = append(paths, path)
		db.authorities.add(path, data)
	}
	cb, err := knownhosts.New(paths...)
	if err != nil {
		return nil, fmt.Errorf("known_hosts: %w", err)
	}
	db.plain = cb
	return db, nil
}

// parsableCopy writes a temporary copy of file with every line that does not parse blanked, so that line
// numbers still hold, and its host names in lower case, and returns its name.
func (k *knownHosts) parsableCopy(file string, data []byte) (string, error) {
	lines := bytes.Split(data, []byte("\n"))
	for i, line := range lines {
		if t := bytes.TrimSpace(line); len(t) == 0 || t[0] == '#' {
			continue
		}
		if _, _, _, _, _, err := ssh.ParseKnownHosts(line); err != nil {
			k.log.V(1).Info("Skipping a known_hosts line that cannot be parsed", "file", file, "line", i+1, "err", err)
			lines[i] = nil
			continue
		}
		lowerHostPatterns(line)
	}
	f, err := os.CreateTemp("", "konnect-known_hosts-")
	if err != nil {
		return "", err
	}
	_, err = f.Write(bytes.Join(lines, []byte("\n")))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// hostPatterns is the field of a known_hosts line that lists its host patterns, after any marker
// (@cert-authority, @revoked); nil for a blank or comment line.
func hostPatterns(line []byte) []byte {
	fields := bytes.Fields(line)
	if len(fields) == 0 || fields[0][0] == '#' {
		return nil
	}
	if fields[0][0] == '@' {
		if len(fields) < 2 {
			return nil
		}
		return fields[1]
	}
	return fields[0]
}

// hasUpperHostPattern reports whether a known_hosts file names a host with an upper-case letter, outside the
// hashed names, whose base64 is not a name.
func hasUpperHostPattern(data []byte) bool {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		for p := range bytes.SplitSeq(hostPatterns(line), []byte(",")) {
			if !bytes.Contains(p, []byte("|")) && bytes.ContainsFunc(p, func(r rune) bool { return 'A' <= r && r <= 'Z' }) {
				return true
			}
		}
	}
	return false
}

// lowerHostPatterns lowercases, in place, the host patterns of a known_hosts line other than hashed names.
func lowerHostPatterns(line []byte) {
	for p := range bytes.SplitSeq(hostPatterns(line), []byte(",")) {
		if bytes.Contains(p, []byte("|")) {
			continue
		}
		for i, c := range p {
			if 'A' <= c && c <= 'Z' {
				p[i] = c + ('a' - 'A')
			}
		}
	}
}

// recorded returns the host keys the file records for addr, without the CA lines that knownhosts lists
// among them (KeyError.Want) as if they were the host's own keys.
func (db *hostDB) recorded(err error) []knownhosts.KnownKey {
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(ke.Want), func(w knownhosts.KnownKey) bool {
		return db.authorities.lines[fileLine{w.Filename, w.Line}]
	})
}

// check verifies a host key or certificate for addr: a certificate against the CAs the file trusts for addr,
// a plain key against the plain lines.
func (db *hostDB) check(addr string, remote net.Addr, key ssh.PublicKey) error {
	cc := &ssh.CertChecker{
		IsHostAuthority: func(auth ssh.PublicKey, address string) bool { return db.authorities.vouches(auth, address) },
		IsRevoked:       db.authorities.revokes,
		HostKeyFallback: db.plainKey,
	}
	return cc.CheckHostKey(addr, remote, key)
}

// plainKey verifies a plain host key. knownhosts also accepts a key that only an @cert-authority line names
// for addr; OpenSSH looks plain keys up among the plain lines alone, and so does this: a CA key is not the
// host's key.
func (db *hostDB) plainKey(addr string, remote net.Addr, key ssh.PublicKey) error {
	err := db.plain(addr, remote, key)
	if err != nil || !db.authorities.isCA(key) {
		return err
	}
	probe, err := probeKey()
	if err != nil {
		return err
	}
	recorded := db.recorded(db.plain(addr, remote, probe))
	if slices.ContainsFunc(recorded, func(w knownhosts.KnownKey) bool { return bytes.Equal(w.Key.Marshal(), key.Marshal()) }) {
		return nil
	}
	return &knownhosts.KeyError{Want: recorded}
}

// algorithms returns the host key algorithms to ask for when connecting to addr: the types already recorded
// for it, so that the server presents the key we know instead of another type we would wrongly call
// "changed", and certificates first when an @cert-authority line covers addr. nil (nothing recorded) leaves
// the library's default order.
func (k *knownHosts) algorithms(addr string) ([]string, error) {
	k.mu.Lock()
	db, err := k.load()
	k.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// A probe key that cannot match: the KeyError lists every key recorded for addr.
	probe, err := probeKey()
	if err != nil {
		return nil, err
	}
	var algos []string
	add := func(a ...string) {
		for _, s := range a {
			if !slices.Contains(algos, s) {
				algos = append(algos, s)
			}
		}
	}
	for _, w := range db.recorded(db.plain(addr, &net.TCPAddr{IP: net.IPv4zero}, probe)) {
		switch t := w.Key.Type(); t {
		case ssh.KeyAlgoRSA:
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			add(t)
		}
	}
	if !db.authorities.namesHost(addr) {
		return algos, nil
	}
	// Ask for a certificate first, of any key type, since the CA's own type says nothing about the host's.
	// A host without one presents a plain key: one of the recorded types, or any when only the CA is.
	var certs, plain []string
	for _, a := range ssh.SupportedAlgorithms().HostKeys {
		if strings.Contains(a, "-cert-") {
			certs = append(certs, a)
		} else {
			plain = append(plain, a)
		}
	}
	if len(algos) == 0 {
		algos = plain
	}
	return slices.Concat(certs, algos), nil
}

var (
	probeOnce sync.Once
	probe     ssh.PublicKey
	probeErr  error
)

// probeKey is a fixed public key that is never a real host's key (a point that no key file would carry).
func probeKey() (ssh.PublicKey, error) {
	probeOnce.Do(func() {
		var raw [32]byte
		for i := range raw {
			raw[i] = 0xa5
		}
		probe, probeErr = ssh.NewPublicKey(ed25519.PublicKey(raw[:]))
	})
	return probe, probeErr
}

// callback returns the HostKeyCallback for one hop, dialled as addr ("host:port"); with hash, a host key that
// --accept-new records is recorded under a hashed name. acceptNew accepts a new host for this hop alone (its
// ssh_config StrictHostKeyChecking).
func (k *knownHosts) callback(addr string, hash, acceptNew bool) ssh.HostKeyCallback {
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		k.mu.Lock()
		defer k.mu.Unlock()
		db, err := k.load()
		if err != nil {
			return err
		}
		if err = db.check(addr, remote, key); err == nil {
			return nil
		}
		var re *knownhosts.RevokedError
		cert, isCert := key.(*ssh.Certificate)
		switch {
		case isCert && db.authorities.revokes(cert):
			key, err = cert.Key, &knownhosts.RevokedError{}
		case isCert && !errors.As(err, &re):
			// A host certificate that no @cert-authority line vouches for (or that is not valid for this
			// host) is judged by its plain key, as OpenSSH does: known, unknown (--accept-new records the
			// plain key) or changed.
			k.log.V(2).Info("Host certificate not trusted; checking its plain key", "host", knownhosts.Normalize(addr), "err", err)
			key = cert.Key
			if err = db.plainKey(addr, remote, key); err == nil {
				return nil
			}
		}
		hke := &HostKeyError{
			Host:           knownhosts.Normalize(addr),
			KnownHostsFile: k.recordFile(),
			KeyType:        keyTypeName(key),
			Fingerprint:    ssh.FingerprintSHA256(key),
			Line:           knownhosts.Line([]string{addr}, key),
		}
		var ke *knownhosts.KeyError
		recorded := db.recorded(err)
		switch {
		case errors.As(err, &re):
			hke.Revoked = true
			return hke
		case len(recorded) > 0:
			hke.Changed = true
			for _, w := range recorded {
				hke.Known = append(hke.Known, fmt.Sprintf("%s:%d", db.name(w.Filename), w.Line))
				if f := db.name(w.Filename); !slices.Contains(hke.KnownFiles, f) {
					hke.KnownFiles = append(hke.KnownFiles, f)
				}
			}
			return hke
		case errors.As(err, &ke):
			if !k.acceptNew && !acceptNew {
				return hke
			}
			if k.recordFile() == "" {
				hke.Unrecorded = errors.New("UserKnownHostsFile is none")
				return hke
			}
			line := hke.Line
			if hash {
				line = knownhosts.Line([]string{knownhosts.HashHostname(hke.Host)}, key)
			}
			if err := k.appendLine(line); errors.Is(err, errNullDevice) {
				// As ssh, which appends to /dev/null: the host is trusted for this connection, and each
				// connection asks again.
				k.log.Info("Accepted the host key for this connection only: known_hosts is the null device", "host", hke.Host,
					"type", hke.KeyType, "fingerprint", hke.Fingerprint, "file", k.recordFile())
				return nil
			} else if errors.Is(err, safepath.ErrShared) {
				hke.Unrecorded = err
				return hke
			} else if err != nil {
				return fmt.Errorf("record new host key for %s in %s: %w", hke.Host, k.recordFile(), err)
			}
			k.log.Info("Permanently added the host key to known_hosts", "host", hke.Host, "type", hke.KeyType,
				"fingerprint", hke.Fingerprint, "file", k.recordFile())
			return nil
		default:
			return fmt.Errorf("check host key of %s: %w", hke.Host, err)
		}
	}
}

// appendLine adds one line to the first user known_hosts file, as OpenSSH's add_host_to_hostfile does: in one write in
// append mode, so that an ssh recording another host at the same time loses nothing, after a newline if the
// last line has none. A new file is created mode 0644 less the umask, as ssh creates it (0600 under umask
// 077; never writable by others), and appears whole: written beside it, then linked into place. Missing
// directories are created 0700.
//
// A symlink is written through, as ssh does, but only where no other user could redirect the write
// (safepath.Resolve): ssh follows any link, so that a user who can plant or change one makes --accept-new
// append to a file of their choosing.
func (k *knownHosts) appendLine(line string) error {
	file, err := safepath.Resolve(k.recordFile())
	if errors.Is(err, safepath.ErrShared) {
		return fmt.Errorf("refusing to write %s: %w", k.recordFile(), err)
	}
	if err != nil {
		return err
	}
	// The null device (UserKnownHostsFile /dev/null) records nothing. Written to, it would discard the line
	// as it does for ssh; but nothing here may replace it, so it is never opened for writing at all.
	if fi, err := os.Stat(file); err == nil && smallfile.IsNull(fi) {
		return errNullDevice
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	if err := createWhole(file, []byte(line+"\n")); !errors.Is(err, fs.ErrExist) {
		return err
	}
	// O_NOFOLLOW: file is what the link led to; only root or we could have put a link there since.
	f, err := os.OpenFile(file, os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return err
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", file)
	} else if size := st.Size(); size > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, size-1); err == nil && last[0] != '\n' {
			line = "\n" + line
		}
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// errNullDevice is appendLine's answer for a known_hosts file that is the null device: nothing recorded.
var errNullDevice = errors.New("known_hosts is the null device")

// createWhole creates path holding data, mode 0644 less the umask, or fails with fs.ErrExist when something
// is there already. Whoever reads path sees no file or the whole of it.
func createWhole(path string, data []byte) (err error) {
	var tmp *os.File
	for range 100 {
		name := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-"+strconv.FormatUint(rand.Uint64(), 36))
		if tmp, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// A hard link never replaces what is there.
	return os.Link(tmp.Name(), path)
}

func keyTypeName(k ssh.PublicKey) string {
	switch k.Type() {
	case ssh.KeyAlgoED25519:
		return "ED25519"
	case ssh.KeyAlgoRSA:
		return "RSA"
	case ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521:
		return "ECDSA"
	default:
		if c, ok := k.(*ssh.Certificate); ok {
			return keyTypeName(c.Key) + "-CERT" // as OpenSSH names it
		}
		return k.Type()
	}
}
