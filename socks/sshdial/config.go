package sshdial

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"golang.org/x/crypto/ssh"
)

// Config describes one SSH destination, how to reach it and how to trust it. It holds no pflag types; Flags
// builds it from the command line. Zero values mean the OpenSSH defaults. As in OpenSSH, "~" is the home
// directory of the running user's passwd entry, not $HOME (used only when there is no entry).
type Config struct {
	// Destination is "[user@]host[:port]" (port only with brackets for IPv6, "[::1]:22") or
	// "ssh://[user@]host[:port]". host may be an alias from the SSH config file.
	Destination string
	// Port overrides the destination's and the config file's port (ssh -p). 0 means not set.
	Port int
	// User overrides the destination's and the config file's user (ssh -l).
	User string
	// IdentityFiles are private keys tried after the agent's keys (ssh -i). Each must exist, and, as OpenSSH
	// requires, one owned by the running user must not be open to group or others.
	IdentityFiles []string
	// AllowUnprotectedKeys accepts identity files that group or others may read, which OpenSSH refuses
	// ("UNPROTECTED PRIVATE KEY FILE").
	AllowUnprotectedKeys bool
	// JumpHosts is the jump chain, first hop first (ssh -J). ["none"] ignores the config file's ProxyJump.
	JumpHosts []string
	// ConfigFile is the ssh_config to read (ssh -F). "" reads ~/.ssh/config; "none" reads nothing.
	ConfigFile string
	// KnownHostsFile holds the trusted host keys, and records new ones (AcceptNew). "" means the config
	// file's UserKnownHostsFile (every file it names is read, the first records), else OpenSSH's
	// ~/.ssh/known_hosts and ~/.ssh/known_hosts2. Either way the config file's GlobalKnownHostsFile (else
	// /etc/ssh/ssh_known_hosts and /etc/ssh/ssh_known_hosts2) is read as well, as OpenSSH reads it: a host
	// it pins to another key is "changed", never new.
	KnownHostsFile string
	// AcceptNew trusts a host seen for the first time and records its key. A changed key is refused anyway.
	AcceptNew bool
	// ConnectTimeout bounds one connection attempt (TCP connect and SSH handshake, per hop) and how long a
	// dial waits for the SSH connection to come back. 0 means 15s.
	ConnectTimeout time.Duration
	// AddressFamily is OpenSSH's AddressFamily (ssh -4, -6): "inet" or "inet6" connects to the first hop's
	// IPv4 or IPv6 addresses only, "any" to whichever the host name resolves to. "" means the config file's
	// AddressFamily for the destination, else "any". Later hops are reached from the hop before them, which
	// resolves their names, as OpenSSH's ProxyJump does; a ProxyCommand makes its own connection.
	AddressFamily string
	// ServerAliveInterval is the keepalive period. 0 means the config file's ServerAliveInterval, else 5s;
	// a negative value disables keepalives. As with OpenSSH, a server that sends nothing for
	// ServerAliveCountMax intervals in a row, keepalives unanswered, is dropped: within
	// ServerAliveInterval × (ServerAliveCountMax+1) of going silent, 20s by default.
	ServerAliveInterval time.Duration
	// ServerAliveCountMax is how many keepalives may go unanswered before the connection is dropped. 0 means
	// the config file's ServerAliveCountMax, else 3.
	ServerAliveCountMax int
	// RetryFirst keeps retrying when a connection attempt is refused (or the host name does not resolve, the
	// peer is not an SSH server, or the ProxyCommand exits) before any connection was up, as when the server is not up yet. Without it Run returns that error: a
	// wrong host or port never heals. Once a connection has been up, every failure but the permanent ones is
	// retried.
	RetryFirst bool
	// MinBackoff and MaxBackoff bound the wait between background reconnection attempts, which doubles
	// after each failure. A dial that waits for the connection does not wait for the backoff: it starts an
	// attempt at once. 0 means 0.5s and 30s.
	MinBackoff, MaxBackoff time.Duration
	// Ciphers is the cipher preference. nil keeps golang.org/x/crypto/ssh's default order, which puts
	// aes128-gcm@openssh.com first: with AES-NI it is the fastest choice on both ends.
	Ciphers []string
	// Connections is how many SSH connections to the destination the Dialer keeps, each with its own
	// transport (and its own sshd process on an OpenSSH server), so that concurrent streams are encrypted on
	// more than one core at each end. A new stream goes to the live connection carrying the fewest. 0 means
	// 1; at most MaxConnections.
	Connections int
	// AgentSocket is the ssh-agent socket. "" means the config file's IdentityAgent, else $SSH_AUTH_SOCK;
	// "none" disables the agent.
	AgentSocket string
	// Passphrase asks for the passphrase of an encrypted key. nil asks on the terminal when stdin is one, and
	// otherwise fails with an error that says to load the key into ssh-agent. The returned slice is wiped
	// once the key is decrypted.
	Passphrase func(keyFile string) ([]byte, error)
	// Ask puts a question to a person when the server accepted a key but wants more (sshd's
	// AuthenticationMethods publickey,password): question is the prompt as OpenSSH shows it ("user@host's
	// password: ", or the server's keyboard-interactive prompt), echo whether the answer may be shown. nil
	// asks on the terminal when stdin is one; otherwise authentication fails with an InteractiveAuthError.
	//
	// When Run's context ends, Run stops waiting for Passphrase and Ask: a call still waiting for a person
	// is left to return in the background, and what it returns then is dropped.
	Ask func(question string, echo bool) (string, error)
	// Log receives the dialer's log lines: connections made, lost and retried, keys skipped, host keys
	// added. The zero Logger discards them; a command passes klog's (klog.NewKlogr()).
	Log logr.Logger
}

// MaxConnections bounds Config.Connections.
const MaxConnections = 16

// DefaultConnectTimeout bounds one SSH connection attempt when Config.ConnectTimeout is zero.
const DefaultConnectTimeout = 15 * time.Second

const (
	// OpenSSH sends no keepalives by default. 5s × (3+1) notices a frozen server within 20s, well before a
	// client gives up on its proxy, for one small packet every 5s.
	defaultAliveInterval = 5 * time.Second
	defaultAliveCountMax = 3
	defaultMinBackoff    = 500 * time.Millisecond
	defaultMaxBackoff    = 30 * time.Second
)

// endpoint is one resolved SSH hop.
type endpoint struct {
	alias    string // what the user wrote, used for display and config lookups
	hostName string // what is dialled
	port     int
	user     string
	identity []string // from the config file (IdentityFile), already expanded
	// certificates are ssh_config CertificateFile entries, expanded: user certificates for the identity
	// files' keys, offered before any key as OpenSSH offers them.
	certificates []string
	// identitiesOnly (ssh_config IdentitiesOnly) offers only the agent's keys that an identity file or
	// certificate names, so that a full agent does not use up the server's MaxAuthTries.
	identitiesOnly bool
	// identityAgent is ssh_config IdentityAgent: a socket, "none", or SSH_AUTH_SOCK / $VAR for the variable.
	identityAgent string
	// hostKeyAlias (ssh_config HostKeyAlias) replaces the address in known_hosts lookups and records.
	hostKeyAlias string
	// hashKnownHosts (ssh_config HashKnownHosts, yes in Debian's /etc/ssh/ssh_config) records a new host
	// under a hashed name, so that known_hosts does not list where one connects.
	hashKnownHosts bool
	// acceptNew is this host's ssh_config StrictHostKeyChecking accept-new (or no/off, taken as accept-new).
	acceptNew bool
	// proxyCommand is the ssh_config ProxyCommand, tokens expanded, whose stdio is the transport to this
	// hop. Only the first hop has one, as with OpenSSH (later hops go through the hop before them).
	proxyCommand string
	// proxyUseFdpass (ssh_config ProxyUseFdpass yes) takes the connection from proxyCommand as a socket it
	// passes back over its stdout, rather than through its stdin and stdout.
	proxyUseFdpass bool
	auth           authSettings // what follows a key the server accepted while asking for more
	// config is what the SSH config files set for this hop, Match blocks evaluated for it.
	config *hostSettings
}

func (e endpoint) addr() string { return net.JoinHostPort(e.hostName, strconv.Itoa(e.port)) }

// knownHostsAddr is the address the host key is looked up and recorded under: the address dialled, or
// HostKeyAlias alone, which OpenSSH uses without a port. Port 22 is what knownhosts.Normalize leaves out.
func (e endpoint) knownHostsAddr() string {
	if e.hostKeyAlias != "" {
		return net.JoinHostPort(e.hostKeyAlias, "22")
	}
	return e.addr()
}

func (e endpoint) String() string { return e.user + "@" + e.addr() }

// plan is a fully resolved Config: the hops to take, in order, and the settings for all of them.
type plan struct {
	hops           []endpoint // jump hosts first, target last
	identityFiles  []string   // explicit (-i) files, each must exist
	defaultIDs     []string   // OpenSSH's default files, skipped when absent
	allowOpenKeys  bool       // AllowUnprotectedKeys
	knownHosts     []string   // UserKnownHostsFile: read; the first records new keys
	globalKnown    []string   // GlobalKnownHostsFile: read only
	acceptNew      bool
	connectTimeout time.Duration
	network        string // of the first hop's TCP connection: "tcp", "tcp4" (AddressFamily inet) or "tcp6"
	aliveInterval  time.Duration
	aliveCountMax  int
	ciphers        []string
	agentSocket    string
	connections    int // at least 1
	retryFirst     bool
	minBackoff     time.Duration
	maxBackoff     time.Duration
	ask            func(question string, echo bool) (string, error) // Config.Ask
}

// probeTimeout is how long a dial that waits for the server's answer gives a keepalive before it declares
// the connection frozen.
func (p *plan) probeTimeout() time.Duration {
	if p.aliveInterval > 0 {
		return p.aliveInterval
	}
	return defaultAliveInterval
}

// configKeywords are the ssh_config keywords konnect reads, besides Host, Include and Match, which shape the
// file. Every lookup names one (readsKeyword), so that the list, which -o's errors use, cannot fall behind.
var configKeywords = map[string]bool{}

func init() {
	for _, k := range []string{"HostName", "User", "Port", "IdentityFile", "CertificateFile", "IdentitiesOnly",
		"IdentityAgent", "ProxyJump", "ProxyCommand", "ProxyUseFdpass", "StrictHostKeyChecking", "ConnectTimeout",
		"ServerAliveInterval", "ServerAliveCountMax", "UserKnownHostsFile", "GlobalKnownHostsFile", "HostKeyAlias",
		"HashKnownHosts", "PreferredAuthentications", "PasswordAuthentication", "KbdInteractiveAuthentication",
		"ChallengeResponseAuthentication", "NumberOfPasswordPrompts", "BatchMode", "AddressFamily"} {
		configKeywords[strings.ToLower(k)] = true
	}
}

// ReadsConfigKeyword says whether konnect reads keyword (any case) from the SSH config file.
func ReadsConfigKeyword(keyword string) bool { return configKeywords[strings.ToLower(keyword)] }

// readsKeyword panics on a lookup of a keyword missing from configKeywords: a programming error, which any test
// that reaches the lookup reports.
func readsKeyword(key string) {
	if !ReadsConfigKeyword(key) {
		panic("sshdial: ssh_config keyword " + key + " is read but missing from configKeywords")
	}
}

// ParseDestination splits "[user@]host[:port]" or "ssh://[user@]host[:port]". port is 0 when absent.
func ParseDestination(s string) (usr, host string, port int, err error) {
	if s == "" {
		return "", "", 0, errors.New("empty SSH destination")
	}
	if strings.HasPrefix(s, "ssh://") {
		u, perr := url.Parse(s)
		if perr != nil {
			return "", "", 0, fmt.Errorf("SSH destination %q: %w", s, perr)
		}
		if u.Path != "" && u.Path != "/" {
			return "", "", 0, fmt.Errorf("SSH destination %q: a path is not allowed", s)
		}
		if u.User != nil {
			usr = u.User.Username()
		}
		host = u.Hostname()
		if p := u.Port(); p != "" {
			if port, err = parsePort(p); err != nil {
				return "", "", 0, fmt.Errorf("SSH destination %q: %w", s, err)
			}
		}
	} else {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			usr, s = s[:i], s[i+1:]
		}
		host = s
		if strings.HasPrefix(s, "[") {
			h, p, serr := net.SplitHostPort(s)
			if serr != nil {
				// "[::1]" without a port.
				if strings.HasSuffix(s, "]") {
					h, p = s[1:len(s)-1], ""
				} else {
					return "", "", 0, fmt.Errorf("SSH destination %q: %w", s, serr)
				}
			}
			host = h
			if p != "" {
				if port, err = parsePort(p); err != nil {
					return "", "", 0, fmt.Errorf("SSH destination %q: %w", s, err)
				}
			}
		} else if strings.Count(s, ":") == 1 {
			// host:port, as in ssh -J and ProxyJump.
			h, p, _ := strings.Cut(s, ":")
			host = h
			if port, err = parsePort(p); err != nil {
				return "", "", 0, fmt.Errorf("SSH destination %q: %w", s, err)
			}
		}
	}
	if host == "" {
		return "", "", 0, fmt.Errorf("SSH destination %q has no host", s)
	}
	if strings.HasPrefix(host, "-") || strings.ContainsAny(host, " \t\r\n/") {
		return "", "", 0, fmt.Errorf("SSH destination %q: invalid host %q", s, host)
	}
	return usr, host, port, nil
}

func parsePort(p string) (int, error) {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", p)
	}
	return n, nil
}

func localUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "root"
}

// addressFamilyNetwork is the network to dial for an AddressFamily value, as OpenSSH spells them.
func addressFamilyNetwork(family string) (string, error) {
	switch strings.ToLower(family) {
	case "", "any":
		return "tcp", nil
	case "inet":
		return "tcp4", nil
	case "inet6":
		return "tcp6", nil
	}
	return "", fmt.Errorf("address family %q is not any, inet or inet6", family)
}

// passwdHome is the home directory in the running user's passwd entry; a variable for tests, which give it
// a directory of their own.
var passwdHome = func() (string, error) {
	u, err := user.Current()
	if err != nil {
		return "", err
	}
	return u.HomeDir, nil
}

// homeDir is the directory "~" stands for, in every path konnect reads (the SSH config file, known_hosts,
// identity files). As OpenSSH (getpwuid(getuid())->pw_dir), it is the home directory of the running user's
// passwd entry, whatever $HOME says; $HOME only when there is no entry to read.
func homeDir() (string, error) {
	if home, err := passwdHome(); err == nil && home != "" {
		return home, nil
	}
	return os.UserHomeDir()
}

// expandPath handles "~/" and the ssh_config tokens that matter for key and known_hosts paths.
func expandPath(p string, e endpoint) string {
	home, _ := homeDir()
	if strings.HasPrefix(p, "~/") {
		p = filepath.Join(home, p[2:])
	}
	r := strings.NewReplacer("%%", "%", "%d", home, "%h", e.hostName, "%r", e.user, "%u", localUser(),
		"%p", strconv.Itoa(e.port), "%n", e.alias)
	return r.Replace(p)
}

// resolveEndpoint applies the config file to one "[user@]host[:port]" hop. cliUser and cliPort (ssh -l,
// -p) win over what the destination says, which wins over the config file.
func resolveEndpoint(dest string, cliUser string, cliPort int, sc *sshConfig) (endpoint, error) {
	usr, alias, port, err := ParseDestination(dest)
	if err != nil {
		return endpoint{}, err
	}
	// As in OpenSSH, -l and -p are set before the file is read, so Match user sees them first.
	givenUser, givenPort := cmp.Or(cliUser, usr), cmp.Or(cliPort, port)
	hc, err := sc.forHost(alias, givenUser, givenPort)
	if err != nil {
		return endpoint{}, err
	}
	e := endpoint{alias: alias, hostName: alias, config: hc}
	if hn := hc.get("HostName"); hn != "" {
		e.hostName = expandHostName(hn, alias)
	}
	// As ssh, which dials, expands %h and looks up known_hosts with the host name lowercased.
	e.hostName = lowerHostName(e.hostName)
	// A typo in an IP address (999.1.1.1) would otherwise go to DNS on every reconnect, for ever.
	if err := address.MistypedIP(e.hostName); err != nil {
		return endpoint{}, fmt.Errorf("host %w", err)
	}
	switch {
	case cliUser != "":
		e.user = cliUser
	case usr != "":
		e.user = usr
	case hc.get("User") != "":
		e.user = hc.get("User")
	default:
		e.user = localUser()
	}
	switch {
	case cliPort != 0:
		e.port = cliPort
	case port != 0:
		e.port = port
	case hc.get("Port") != "":
		if e.port, err = parsePort(hc.get("Port")); err != nil {
			return endpoint{}, fmt.Errorf("ssh config Port for %s: %w", alias, err)
		}
	default:
		e.port = 22
	}
	for _, id := range hc.getAll("IdentityFile") {
		e.identity = append(e.identity, expandPath(id, e))
	}
	for _, c := range hc.getAll("CertificateFile") {
		e.certificates = append(e.certificates, expandPath(c, e))
	}
	e.identitiesOnly = strings.EqualFold(hc.get("IdentitiesOnly"), "yes")
	if a := hc.get("IdentityAgent"); a != "" {
		e.identityAgent = expandPath(a, e)
	}
	// Lowercased, as ssh lowercases it after reading its config files: it looks up and records "myalias"
	// for HostKeyAlias MyAlias, which a hashed known_hosts name shows.
	e.hostKeyAlias = strings.ToLower(hc.get("HostKeyAlias"))
	e.hashKnownHosts = strings.EqualFold(hc.get("HashKnownHosts"), "yes")
	if e.auth, err = readAuthSettings(hc, alias); err != nil {
		return endpoint{}, err
	}
	return e, nil
}

// resolve turns a Config into a plan: it reads the SSH config file and checks every setting, without touching
// the network.
func resolve(cfg Config) (*plan, error) { return resolveContext(context.Background(), cfg) }

// resolveContext is resolve, its Match exec commands stopped when ctx ends.
func resolveContext(ctx context.Context, cfg Config) (*plan, error) {
	sc, err := loadSSHConfig(cfg.ConfigFile, cfg.Log)
	if err != nil {
		return nil, err
	}
	if sc != nil {
		sc.ctx = ctx
	}
	target, err := resolveEndpoint(cfg.Destination, cfg.User, cfg.Port, sc)
	if err != nil {
		return nil, err
	}
	p := &plan{
		acceptNew:      cfg.AcceptNew,
		connectTimeout: cfg.ConnectTimeout,
		aliveInterval:  cfg.ServerAliveInterval,
		aliveCountMax:  cfg.ServerAliveCountMax,
		ciphers:        cfg.Ciphers,
		agentSocket:    cfg.AgentSocket,
		connections:    max(cfg.Connections, 1),
		allowOpenKeys:  cfg.AllowUnprotectedKeys,
		retryFirst:     cfg.RetryFirst,
		minBackoff:     cfg.MinBackoff,
		maxBackoff:     cfg.MaxBackoff,
		ask:            cfg.Ask,
	}
	if p.minBackoff <= 0 {
		p.minBackoff = defaultMinBackoff
	}
	if p.maxBackoff <= 0 {
		p.maxBackoff = defaultMaxBackoff
	}
	if p.maxBackoff < p.minBackoff {
		return nil, fmt.Errorf("SSH backoff: the maximum %s is below the minimum %s", p.maxBackoff, p.minBackoff)
	}
	if cfg.Connections < 0 || cfg.Connections > MaxConnections {
		return nil, fmt.Errorf("SSH connections: %d is not from 1 to %d", cfg.Connections, MaxConnections)
	}
	if p.connectTimeout <= 0 {
		p.connectTimeout = DefaultConnectTimeout
		if v := target.config.get("ConnectTimeout"); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				p.connectTimeout = time.Duration(n) * time.Second
			}
		}
	}
	family, from := cfg.AddressFamily, "AddressFamily"
	if family == "" {
		family, from = target.config.get("AddressFamily"), "the SSH config file's AddressFamily for "+target.alias
	}
	if p.network, err = addressFamilyNetwork(family); err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	if p.aliveInterval == 0 {
		p.aliveInterval = defaultAliveInterval
		if v := target.config.get("ServerAliveInterval"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("ssh config ServerAliveInterval for %s: %q is not a number of seconds", target.alias, v)
			}
			p.aliveInterval = time.Duration(n) * time.Second
			if n == 0 {
				p.aliveInterval = -1
			}
		}
	}
	if p.aliveCountMax <= 0 {
		p.aliveCountMax = defaultAliveCountMax
		if v := target.config.get("ServerAliveCountMax"); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				p.aliveCountMax = n
			}
		}
	}

	// -J wins over the config file's ProxyJump and ProxyCommand, as with OpenSSH ("-J none" drops both);
	// in the file, whichever of the two comes first applies.
	jumps := cfg.JumpHosts
	if len(jumps) == 0 {
		route, err := proxyRoute(&target, cfg.Log)
		if err != nil {
			return nil, err
		}
		jumps = route
	}
	if len(jumps) == 1 && jumps[0] == "none" {
		jumps = nil
	}
	for _, j := range jumps {
		// Jump hosts take their user and port from their own spec and config entry, not from -l and -p,
		// as with OpenSSH.
		e, err := resolveEndpoint(j, "", 0, sc)
		if err != nil {
			return nil, fmt.Errorf("jump host: %w", err)
		}
		p.hops = append(p.hops, e)
	}
	p.hops = append(p.hops, target)
	if p.hops, err = reachFirstHop(p.hops, sc, cfg.Log); err != nil {
		return nil, err
	}
	for i := range p.hops {
		if err := strictHostKeyChecking(&p.hops[i], cfg.AcceptNew, cfg.Log); err != nil {
			return nil, err
		}
	}

	for _, f := range cfg.IdentityFiles {
		f = expandPath(f, target)
		if err := checkIdentityFile(f, p.allowOpenKeys); err != nil {
			return nil, err
		}
		p.identityFiles = append(p.identityFiles, f)
	}
	// An IdentityFile of the config file may be absent (OpenSSH skips it), but one that is there and open to
	// others is refused like -i: every connection would otherwise fail on it, or use a key others can copy.
	for _, h := range p.hops {
		for _, f := range h.identity {
			if err := checkKeyPermissions(f, p.allowOpenKeys); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("ssh config IdentityFile for %s: %w", h.alias, err)
			}
		}
	}
	// Each hop without an identity of its own (-i or IdentityFile) tries these, as OpenSSH does per host.
	home, _ := homeDir()
	if home != "" {
		for _, n := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			p.defaultIDs = append(p.defaultIDs, filepath.Join(home, ".ssh", n))
		}
	}

	userKnown := target.config.get("UserKnownHostsFile")
	if cfg.KnownHostsFile != "" {
		userKnown = cfg.KnownHostsFile
	}
	if p.knownHosts, err = knownHostsFiles(userKnown, defaultUserKnownHosts, target); err != nil {
		return nil, err
	}
	if p.globalKnown, err = knownHostsFiles(target.config.get("GlobalKnownHostsFile"), defaultGlobalKnownHosts, target); err != nil {
		return nil, err
	}
	return p, nil
}

// OpenSSH's defaults for UserKnownHostsFile and GlobalKnownHostsFile (ssh -G shows them).
var (
	defaultUserKnownHosts   = []string{"~/.ssh/known_hosts", "~/.ssh/known_hosts2"}
	defaultGlobalKnownHosts = []string{"/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"}
)

// knownHostsFiles expands a UserKnownHostsFile or GlobalKnownHostsFile value, a space-separated list: ""
// means defaults, "none" no file. A missing file is an empty one (AcceptNew may create the first user
// file), and so is the null device (UserKnownHostsFile /dev/null, as for throwaway hosts; nothing is ever
// written to it); any other file that is not a regular one is refused; one that cannot be read would fail every connection, and each reconnect after it, so it fails the
// start instead.
func knownHostsFiles(value string, defaults []string, e endpoint) ([]string, error) {
	names := strings.Fields(value)
	if len(names) == 0 {
		names = defaults
	}
	if len(names) == 1 && names[0] == "none" {
		return nil, nil
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "~/") {
			if home, err := homeDir(); err != nil || home == "" {
				return nil, fmt.Errorf("no home directory to find %s in; set the known_hosts file explicitly", n)
			}
		}
		f := expandPath(n, e)
		if fi, err := os.Stat(f); err == nil && !fi.Mode().IsRegular() && !smallfile.IsNull(fi) {
			return nil, fmt.Errorf("known_hosts %s is not a file", f)
		} else if err == nil {
			if _, err := smallfile.ReadUpTo(f, maxKnownHostsSize); err != nil {
				return nil, fmt.Errorf("known_hosts: %w", err)
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// checkIdentityFile refuses an identity file given explicitly that is no private key OpenSSH's format or
// PEM can hold, or that others may read (unless allowOpen): every connection would fail on it, and
// reconnecting would not help. An encrypted key passes; its passphrase is asked for when it is used.
func checkIdentityFile(f string, allowOpen bool) error {
	if fi, err := os.Stat(f); err != nil {
		return fmt.Errorf("identity file: %w", err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("identity file %s is not a file", f)
	}
	if err := checkKeyPermissions(f, allowOpen); err != nil {
		return err
	}
	data, err := smallfile.Read(f)
	if err != nil {
		return fmt.Errorf("identity file: %w", err)
	}
	var missing *ssh.PassphraseMissingError
	if _, err := ssh.ParsePrivateKey(data); err != nil && !errors.As(err, &missing) {
		return fmt.Errorf("identity file %s is not a private key: %w", f, err)
	}
	return nil
}

// SplitJump splits a comma-separated list of jump hosts (ssh -J), dropping empty entries.
func SplitJump(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// maxHops bounds a route of jump hosts, each reached through the next one's ProxyJump.
const maxHops = 16

// reachFirstHop completes a route (jump hosts, then the destination) as ssh -J completes it: ssh reaches the
// first jump host with "ssh -W", which reads that host's own config entry, so the first hop is reached
// through its own ProxyCommand, or through its own ProxyJump, whose first host is reached the same way in
// turn. The hops after the first are reached through the hop before them, whatever their entries say. A
// host that comes back in the route is a loop, which ssh stops at too ("jumphost loop").
func reachFirstHop(route []endpoint, sc *sshConfig, log logr.Logger) ([]endpoint, error) {
	for {
		if err := checkLoop(route); err != nil {
			return nil, err
		}
		if len(route) < 2 {
			return route, nil
		}
		first := &route[0]
		jumps, err := proxyRoute(first, log)
		if err != nil {
			return nil, fmt.Errorf("jump host: %w", err)
		}
		if len(jumps) == 0 {
			return route, nil
		}
		var before []endpoint
		for _, j := range jumps {
			e, err := resolveEndpoint(j, "", 0, sc)
			if err != nil {
				return nil, fmt.Errorf("jump host %s's ProxyJump: %w", first.alias, err)
			}
			before = append(before, e)
		}
		route = append(before, route...)
		if len(route) > maxHops {
			return nil, fmt.Errorf("jump hosts: more than %d hops (%s)", maxHops-1, routeString(route))
		}
	}
}

// checkLoop refuses a route that reaches one server (user, host and port) twice.
func checkLoop(route []endpoint) error {
	seen := map[string]bool{}
	for _, h := range route {
		if seen[h.String()] {
			return fmt.Errorf("jump host loop via %s: the route %s reaches it twice, and ssh stops there too; "+
				"keep %s out of the Host or Match blocks whose ProxyJump names it", h, routeString(route), h.alias)
		}
		seen[h.String()] = true
	}
	return nil
}

// routeString is a route as the log and errors show it: each hop's alias, in order.
func routeString(route []endpoint) string {
	names := make([]string, len(route))
	for i, h := range route {
		names[i] = h.alias
	}
	return strings.Join(names, " -> ")
}

// proxyRoute reads how e is reached from the config file: the ProxyJump list, or a ProxyCommand (set on e
// with its tokens expanded), whichever the file sets first for e. "none" for either means a direct
// connection.
func proxyRoute(e *endpoint, log logr.Logger) (jumps []string, err error) {
	key, value, file, line := e.config.first("ProxyJump", "ProxyCommand")
	if value == "" || value == "none" {
		return nil, nil
	}
	if key == "ProxyJump" {
		return SplitJump(value), nil
	}
	if e.proxyCommand, err = expandProxyCommand(value, *e); err != nil {
		return nil, fmt.Errorf("ssh config %s: %w", file, err)
	}
	if e.proxyUseFdpass, err = proxyUseFdpass(e); err != nil {
		return nil, err
	}
	log.V(1).Info("Reaching the SSH server through ProxyCommand", "host", e.alias, "command", e.proxyCommand,
		"proxyUseFdpass", e.proxyUseFdpass, "file", file, "line", line)
	return nil, nil
}

// proxyUseFdpass reads e's ProxyUseFdpass as OpenSSH reads a flag: yes or true, no or false, in any case.
func proxyUseFdpass(e *endpoint) (bool, error) {
	_, v, file, line := e.config.first("ProxyUseFdpass")
	switch strings.ToLower(v) {
	case "yes", "true":
		return true, nil
	case "", "no", "false":
		return false, nil
	}
	return false, fmt.Errorf("ssh config %s line %d: ProxyUseFdpass %q for %s is not yes or no", file, line, v, e.alias)
}

// strictHostKeyChecking applies e's ssh_config StrictHostKeyChecking. konnect never asks and never connects
// to a host whose key changed: yes and ask (the default) refuse an unknown host, accept-new records it, and no
// or off, which in OpenSSH also let a changed key through, are taken as accept-new, with a warning. The
// --accept-new flag (cliAcceptNew) accepts new hosts whatever the file says.
func strictHostKeyChecking(e *endpoint, cliAcceptNew bool, log logr.Logger) error {
	_, v, file, line := e.config.first("StrictHostKeyChecking")
	switch strings.ToLower(v) {
	case "", "yes", "ask":
		e.acceptNew = false
	case "accept-new":
		e.acceptNew = true
		if !cliAcceptNew {
			log.Info("StrictHostKeyChecking accept-new in the SSH config file: the key of a host seen for the first time is added to known_hosts; a changed key is refused",
				"host", e.alias, "file", file, "line", line)
		}
	case "no", "off":
		e.acceptNew = true
		log.Info("WARNING: StrictHostKeyChecking "+v+" in the SSH config file is taken as accept-new: konnect adds the key of a host seen for the first time "+
			"to known_hosts, but never connects to a host whose key changed", "host", e.alias, "file", file, "line", line)
	default:
		return fmt.Errorf("ssh config %s line %d: StrictHostKeyChecking %q for %s is not yes, accept-new, no, off or ask", file, line, v, e.alias)
	}
	return nil
}
