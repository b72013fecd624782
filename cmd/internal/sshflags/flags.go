// Package sshflags holds the SSH flags of the commands that dial over SSH (`konnect socks`, `konnect proxy
// --via`), spelled the same in both, and turns them into an sshdial.Config.
package sshflags

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/spf13/pflag"
	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"
)

// Names are the flags behind the sshdial.Config fields that sshdial's errors name.
var Names = flagerr.Names{
	"AcceptNew":            "--accept-new",
	"RetryFirst":           "--retry-first",
	"AllowUnprotectedKeys": "--allow-unprotected-key",
}

// Flags are the SSH command-line flags shared by every command that dials over SSH, so that they are spelled
// the same everywhere. NewFlags spells out the defaults.
type Flags struct {
	Port                int
	User                string
	IdentityFiles       []string
	Jump                string
	ConfigFile          string
	KnownHostsFile      string
	AcceptNew           bool
	ConnectTimeout      time.Duration
	ServerAliveInterval time.Duration
	Ciphers             []string
	AllowUnprotectedKey bool
	RetryFirst          bool
	// Connections is --ssh-connections, registered by AddConnectionsFlag for the commands that carry many
	// streams at once.
	Connections int

	// ssh's own flags, taken so that an `ssh -D 1080 -N -C host` line can be pasted (see AddFlags).
	NoCommand   bool     // -N: konnect never runs a remote command
	Quiet       bool     // -q: log errors only (see Quieten)
	Compression bool     // -C: accepted and ignored, with a notice (see Notice)
	IPv4, IPv6  bool     // -4, -6: AddressFamily inet, inet6
	Background  bool     // -f: refused, see checkHabits
	Options     []string // -o: refused with the flag or ssh_config keyword that does it, see checkHabits

	registered []*pflag.Flag // by AddFlags and AddConnectionsFlag, for Given
}

// NewFlags returns the defaults: everything from the SSH config file or OpenSSH's defaults.
func NewFlags() *Flags {
	return &Flags{
		ConnectTimeout: sshdial.DefaultConnectTimeout,
		Connections:    1,
	}
}

// AddFlags registers the SSH flags. The OpenSSH shorthands (-p, -l, -i, -J, -F) are added only where the
// flag set does not already use that letter, so a command that owns -p (kubectl proxy's --port) registers
// its own flags first and keeps it.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	short := func(s string) string {
		if fs.ShorthandLookup(s) != nil {
			return ""
		}
		return s
	}
	fs.IntVarP(&f.Port, "ssh-port", short("p"), f.Port, "Port of the SSH server (like ssh -p). Default: the SSH config file's Port, else 22.")
	fs.StringVarP(&f.User, "ssh-user", short("l"), f.User, "User to log in as on the SSH server (like ssh -l). Default: the destination's user@, the SSH config file's User, else the local user.")
	fs.StringArrayVarP(&f.IdentityFiles, "identity", short("i"), f.IdentityFiles, "Private key file, repeatable (like ssh -i); the value is one path, commas included. Tried after the keys of ssh-agent ($SSH_AUTH_SOCK). Default: the SSH config file's IdentityFile, else ~/.ssh/id_ed25519, id_ecdsa, id_rsa.")
	fs.StringVarP(&f.Jump, "jump", short("J"), f.Jump, "Jump hosts, comma-separated [user@]host[:port] (like ssh -J); it overrides the SSH config file's ProxyJump and ProxyCommand, and \"none\" ignores both. Default: the SSH config file's ProxyJump or ProxyCommand, whichever it sets first.")
	fs.StringVarP(&f.ConfigFile, "ssh-config", short("F"), f.ConfigFile, "SSH config file (like ssh -F); \"none\" reads none. Default: ~/.ssh/config, then /etc/ssh/ssh_config. Read: Host, HostName, User, Port, IdentityFile, CertificateFile, IdentitiesOnly, IdentityAgent, ProxyJump, ProxyCommand (run with $SHELL, tokens %h %p %r %n %%), ProxyUseFdpass, StrictHostKeyChecking (no and off are taken as accept-new), ConnectTimeout, AddressFamily, ServerAliveInterval, ServerAliveCountMax, UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias, HashKnownHosts, NumberOfPasswordPrompts, BatchMode (both ask nothing with 0 or yes), Include, Match (evaluated as ssh does; blocks needing localnetwork, tagged, version, sessiontype or command are skipped with a warning); other keywords ignored.")
	fs.StringVar(&f.KnownHostsFile, "known-hosts", f.KnownHostsFile, "known_hosts file with the trusted host keys, where --accept-new records new ones (hashed entries and [host]:port are understood); it replaces the user files only, as ssh -o UserKnownHostsFile does. Default: the SSH config file's UserKnownHostsFile, else ~/.ssh/known_hosts and ~/.ssh/known_hosts2. The GlobalKnownHostsFile files (default /etc/ssh/ssh_known_hosts and ssh_known_hosts2) are read as well: a host they pin to another key is refused.")
	fs.BoolVar(&f.AcceptNew, "accept-new", f.AcceptNew, "Trust an SSH host seen for the first time and add its key to the first user known_hosts file, as the SSH config file's StrictHostKeyChecking accept-new does for its hosts. A changed host key, in any known_hosts file, is always refused.")
	fs.DurationVar(&f.ConnectTimeout, "connect-timeout", f.ConnectTimeout, "Limit for one SSH connection attempt, and for how long a new proxied connection waits while the SSH connection is re-established.")
	fs.DurationVar(&f.ServerAliveInterval, "server-alive-interval", f.ServerAliveInterval, "Keepalive period on the SSH connection; 0 means the SSH config file's ServerAliveInterval, else 5s; negative disables. "+
		"A server silent for ServerAliveCountMax (3) periods in a row is dropped and reconnected; a proxied connection whose SSH answer is a second late checks sooner.")
	fs.BoolVar(&f.RetryFirst, "retry-first", f.RetryFirst, "Keep retrying when the SSH server refuses the first connection (or its name does not resolve), e.g. while it boots. Without it that ends the command: a wrong host or port never heals.")
	fs.BoolVar(&f.AllowUnprotectedKey, "allow-unprotected-key", f.AllowUnprotectedKey, "Use identity files that group or others may read, which OpenSSH refuses (UNPROTECTED PRIVATE KEY FILE).")
	fs.StringSliceVar(&f.Ciphers, "cipher", f.Ciphers, "SSH ciphers in order of preference, e.g. chacha20-poly1305@openssh.com. Default: aes128-gcm@openssh.com first, the fastest with AES-NI.")

	// ssh's flags that konnect takes so that an ssh command line can be pasted. -q is not an SSH option, so
	// it is not among the flags that Given reports.
	fs.BoolVarP(&f.NoCommand, "no-command", short("N"), f.NoCommand, "Accepted for ssh -N habits; it changes nothing: konnect never runs a remote command, it only forwards.")
	fs.BoolVarP(&f.Quiet, "quiet", short("q"), f.Quiet, "Log errors only, no informational lines or warnings (like ssh -q).")
	fs.BoolVarP(&f.Compression, "compression", short("C"), f.Compression, "Accepted for ssh -C habits and ignored, with a notice: the Go SSH library konnect uses has no compression.")
	fs.BoolVarP(&f.IPv4, "ipv4", short("4"), f.IPv4, "Connect to the SSH server (the first jump host, with -J) over IPv4 only (like ssh -4). Default: the SSH config file's AddressFamily, else every address the name resolves to.")
	fs.BoolVarP(&f.IPv6, "ipv6", short("6"), f.IPv6, "Connect to the SSH server (the first jump host, with -J) over IPv6 only (like ssh -6). Default: the SSH config file's AddressFamily, else every address the name resolves to.")
	fs.BoolVarP(&f.Background, "background", short("f"), f.Background, "Not supported (ssh -f): an error. konnect stays in the foreground; run it with & or as a systemd service.")
	fs.StringArrayVarP(&f.Options, "ssh-option", short("o"), f.Options, "Not supported (ssh -o Key=Value): an error that names the konnect flag for Key, or says to put it in the SSH config file (~/.ssh/config, or the file of -F).")
	for _, n := range []string{"ssh-port", "ssh-user", "identity", "jump", "ssh-config", "known-hosts", "accept-new", "connect-timeout", "server-alive-interval", "cipher", "retry-first", "allow-unprotected-key",
		"no-command", "compression", "ipv4", "ipv6", "background", "ssh-option"} {
		f.registered = append(f.registered, fs.Lookup(n))
	}
}

// Quieten applies -q, before anything is logged: ssh -q keeps only errors.
func (f *Flags) Quieten() {
	if f.Quiet {
		daemon.LogErrorsOnly()
	}
}

// Notice logs, once the flags are valid, that -C is ignored (a warning, which -q silences as ssh -q does).
func (f *Flags) Notice() {
	if f.Compression {
		klog.Warning("-C (--compression): ignored: the Go SSH library konnect uses has no compression")
	}
}

// sshOptionFlags are the konnect flags that do what an ssh -o keyword does, by lower-case keyword.
var sshOptionFlags = map[string]string{
	"port":                  "--ssh-port (-p)",
	"user":                  "--ssh-user (-l)",
	"identityfile":          "--identity (-i)",
	"proxyjump":             "--jump (-J)",
	"userknownhostsfile":    "--known-hosts",
	"connecttimeout":        "--connect-timeout (a duration: 10s)",
	"addressfamily":         "-4 (--ipv4) for inet, -6 (--ipv6) for inet6",
	"serveraliveinterval":   "--server-alive-interval (a duration: 30s)",
	"ciphers":               "--cipher",
	"dynamicforward":        "-D",
	"stricthostkeychecking": "--accept-new for accept-new on every host, or StrictHostKeyChecking per host in the SSH config file (konnect always checks host keys)",
}

// habitError names an ssh flag as given and as konnect spells it: "-f (--background): ...", or with its
// value: "-o (--ssh-option "User=alice"): ...".
func habitError(short, long, format string, args ...any) error {
	return fmt.Errorf("-%s (--%s): %s", short, long, fmt.Sprintf(format, args...))
}

// checkHabits refuses the ssh flags that konnect cannot honour, naming each, and says what does the same.
func (f *Flags) checkHabits() error {
	switch {
	case f.Background:
		return habitError("f", "background", "konnect does not go to the background: it keeps running in the foreground; start it with & (and nohup), or as a systemd service")
	case f.IPv4 && f.IPv6:
		return habitError("6", "ipv6", "conflicts with -4 (--ipv4): give one of them, or neither to use every address the host name resolves to")
	}
	for _, o := range f.Options {
		key, _, _ := strings.Cut(strings.TrimSpace(o), "=")
		key, _, _ = strings.Cut(key, " ")
		const inConfig = "put %s in the SSH config file (~/.ssh/config, or a file given with -F FILE), in the destination's Host block"
		lower := strings.ToLower(key)
		flag, hasFlag := sshOptionFlags[lower]
		switch {
		case hasFlag && sshdial.ReadsConfigKeyword(key):
			return habitError("o", "ssh-option "+strconv.Quote(o), "not supported; use %s, or "+inConfig, flag, key)
		case hasFlag:
			return habitError("o", "ssh-option "+strconv.Quote(o), "not supported; use %s", flag)
		case sshdial.ReadsConfigKeyword(key):
			return habitError("o", "ssh-option "+strconv.Quote(o), "not supported; "+inConfig, key)
		default:
			return habitError("o", "ssh-option "+strconv.Quote(o), "not supported, and konnect does not read %s from the SSH config file either", key)
		}
	}
	return nil
}

// addressFamily is the AddressFamily that -4 or -6 asks for, or "" for the SSH config file's.
func (f *Flags) addressFamily() string {
	switch {
	case f.IPv4:
		return "inet"
	case f.IPv6:
		return "inet6"
	}
	return ""
}

// Given returns the SSH flags set on the command line, as "--name": for a command where SSH is optional,
// to refuse them when it is off rather than ignore them.
func (f *Flags) Given() []string {
	var given []string
	for _, fl := range f.registered {
		if fl.Changed {
			given = append(given, "--"+fl.Name)
		}
	}
	return given
}

// AddConnectionsFlag registers --ssh-connections.
func (f *Flags) AddConnectionsFlag(fs *pflag.FlagSet) {
	fs.IntVar(&f.Connections, "ssh-connections", f.Connections, fmt.Sprintf("SSH connections to keep to the destination, 1 to %d. "+
		"OpenSSH encrypts each connection on one core at each end; with more than one, concurrent proxied connections are spread over them "+
		"(each new one to the connection carrying the fewest), each SSH connection reconnects on its own, and host keys are checked on every one.", sshdial.MaxConnections))
	f.registered = append(f.registered, fs.Lookup("ssh-connections"))
}

// Config checks the flags and builds a Config for destination, naming the flag in every error.
func (f *Flags) Config(destination string) (sshdial.Config, error) {
	if err := f.checkHabits(); err != nil {
		return sshdial.Config{}, err
	}
	if destination == "" {
		return sshdial.Config{}, fmt.Errorf("an SSH destination [user@]host is required")
	}
	if _, _, _, err := sshdial.ParseDestination(destination); err != nil {
		return sshdial.Config{}, err
	}
	if f.Port != 0 && (f.Port < 1 || f.Port > 65535) {
		return sshdial.Config{}, fmt.Errorf("--ssh-port: %d is not a port from 1 to 65535", f.Port)
	}
	if f.ConnectTimeout <= 0 {
		return sshdial.Config{}, fmt.Errorf("--connect-timeout: must be positive, got %s", f.ConnectTimeout)
	}
	jumps := sshdial.SplitJump(f.Jump)
	for _, j := range jumps {
		if j == "none" && len(jumps) == 1 {
			break
		}
		if _, _, _, err := sshdial.ParseDestination(j); err != nil {
			return sshdial.Config{}, fmt.Errorf("--jump: %w", err)
		}
	}
	if f.Connections < 1 || f.Connections > sshdial.MaxConnections {
		return sshdial.Config{}, fmt.Errorf("--ssh-connections: %d is not from 1 to %d", f.Connections, sshdial.MaxConnections)
	}
	supported := ssh.SupportedAlgorithms().Ciphers
	for _, c := range f.Ciphers {
		if !slices.Contains(supported, c) {
			return sshdial.Config{}, fmt.Errorf("--cipher: %q is not supported; choose from %v", c, supported)
		}
	}
	return sshdial.Config{
		Destination:          destination,
		Port:                 f.Port,
		User:                 f.User,
		IdentityFiles:        slices.Clone(f.IdentityFiles),
		JumpHosts:            jumps,
		ConfigFile:           f.ConfigFile,
		KnownHostsFile:       f.KnownHostsFile,
		AcceptNew:            f.AcceptNew,
		ConnectTimeout:       f.ConnectTimeout,
		AddressFamily:        f.addressFamily(),
		ServerAliveInterval:  f.ServerAliveInterval,
		Ciphers:              slices.Clone(f.Ciphers),
		Connections:          f.Connections,
		AllowUnprotectedKeys: f.AllowUnprotectedKey,
		RetryFirst:           f.RetryFirst,
	}, nil
}
