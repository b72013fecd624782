// Package sshflags holds the SSH flags of the commands that dial over SSH (`konnect socks`, `konnect proxy
// --via`), spelled the same in both, and turns them into an sshdial.Config.
package sshflags

import (
	"fmt"
	"slices"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/spf13/pflag"
	"golang.org/x/crypto/ssh"
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
	fs.StringSliceVarP(&f.IdentityFiles, "identity", short("i"), f.IdentityFiles, "Private key file, repeatable (like ssh -i). Tried after the keys of ssh-agent ($SSH_AUTH_SOCK). Default: the SSH config file's IdentityFile, else ~/.ssh/id_ed25519, id_ecdsa, id_rsa.")
	fs.StringVarP(&f.Jump, "jump", short("J"), f.Jump, "Jump hosts, comma-separated [user@]host[:port] (like ssh -J); it overrides the SSH config file's ProxyJump and ProxyCommand, and \"none\" ignores both. Default: the SSH config file's ProxyJump or ProxyCommand, whichever it sets first.")
	fs.StringVarP(&f.ConfigFile, "ssh-config", short("F"), f.ConfigFile, "SSH config file (like ssh -F); \"none\" reads none. Default: ~/.ssh/config, then /etc/ssh/ssh_config. Read: Host, HostName, User, Port, IdentityFile, CertificateFile, IdentitiesOnly, IdentityAgent, ProxyJump, ProxyCommand (run with $SHELL, tokens %h %p %r %n %%), StrictHostKeyChecking (no and off are taken as accept-new), ConnectTimeout, ServerAliveInterval, ServerAliveCountMax, UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias, HashKnownHosts, Include; Match blocks are skipped with a warning, other keywords ignored.")
	fs.StringVar(&f.KnownHostsFile, "known-hosts", f.KnownHostsFile, "known_hosts file with the trusted host keys, where --accept-new records new ones (hashed entries and [host]:port are understood); it replaces the user files only, as ssh -o UserKnownHostsFile does. Default: the SSH config file's UserKnownHostsFile, else ~/.ssh/known_hosts and ~/.ssh/known_hosts2. The GlobalKnownHostsFile files (default /etc/ssh/ssh_known_hosts and ssh_known_hosts2) are read as well: a host they pin to another key is refused.")
	fs.BoolVar(&f.AcceptNew, "accept-new", f.AcceptNew, "Trust an SSH host seen for the first time and add its key to the first user known_hosts file, as the SSH config file's StrictHostKeyChecking accept-new does for its hosts. A changed host key, in any known_hosts file, is always refused.")
	fs.DurationVar(&f.ConnectTimeout, "connect-timeout", f.ConnectTimeout, "Limit for one SSH connection attempt, and for how long a new proxied connection waits while the SSH connection is re-established.")
	fs.DurationVar(&f.ServerAliveInterval, "server-alive-interval", f.ServerAliveInterval, "Keepalive period on the SSH connection; 0 means the SSH config file's ServerAliveInterval, else 5s; negative disables. "+
		"A server silent for ServerAliveCountMax (3) periods in a row is dropped and reconnected; a proxied connection whose SSH answer is a second late checks sooner.")
	fs.BoolVar(&f.RetryFirst, "retry-first", f.RetryFirst, "Keep retrying when the SSH server refuses the first connection (or its name does not resolve), e.g. while it boots. Without it that ends the command: a wrong host or port never heals.")
	fs.BoolVar(&f.AllowUnprotectedKey, "allow-unprotected-key", f.AllowUnprotectedKey, "Use identity files that group or others may read, which OpenSSH refuses (UNPROTECTED PRIVATE KEY FILE).")
	fs.StringSliceVar(&f.Ciphers, "cipher", f.Ciphers, "SSH ciphers in order of preference, e.g. chacha20-poly1305@openssh.com. Default: aes128-gcm@openssh.com first, the fastest with AES-NI.")
	for _, n := range []string{"ssh-port", "ssh-user", "identity", "jump", "ssh-config", "known-hosts", "accept-new", "connect-timeout", "server-alive-interval", "cipher", "retry-first", "allow-unprotected-key"} {
		f.registered = append(f.registered, fs.Lookup(n))
	}
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
		ServerAliveInterval:  f.ServerAliveInterval,
		Ciphers:              slices.Clone(f.Ciphers),
		Connections:          f.Connections,
		AllowUnprotectedKeys: f.AllowUnprotectedKey,
		RetryFirst:           f.RetryFirst,
	}, nil
}
