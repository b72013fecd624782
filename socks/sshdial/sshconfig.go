package sshdial

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/kevinburke/ssh_config"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// The SSH config files are read as OpenSSH reads them: top to bottom, Include files where their line is,
// each Host or Match line deciding whether the lines after it apply, the first value of a keyword winning.
// Which blocks apply depends on the host (Host lines), and for Match on what was read before the line
// (HostName, User), so the files are evaluated once per host (forHost), and lookups read what applied.

// sshConfig is the SSH config files as read, in order; nil means no file.
type sshConfig struct {
	files []*configFile
	log   logr.Logger     // where a Match block konnect cannot evaluate is reported
	ctx   context.Context // stops Match exec commands; nil for none
	// warned holds the "file:line" of the Match blocks reported: once each, though every hop and the final
	// pass read them again.
	warned map[string]bool
}

// configFile is one ssh_config file: the lines that matter, in order, the files each Include names read.
type configFile struct {
	path  string
	lines []configLine
}

// configLine is a Host or Match line, an Include, or a setting.
type configLine struct {
	kind     lineKind
	line     int
	hosts    []string         // Host: its patterns
	match    []matchCriterion // Match: its criteria, in order
	included []*configFile    // Include: the files it names, in glob order
	key      string           // a setting's keyword, as written
	value    string           // a setting's value, as the parser reads it
}

type lineKind int

const (
	settingLine lineKind = iota
	hostLine
	matchLine
	includeLine
)

// matchCriterion is one criterion of a Match line, such as "!host *.corp" or "exec true".
type matchCriterion struct {
	negate bool
	name   string // lower case
	arg    string // "" for all, canonical and final
}

// One reading of the SSH config files (loadSSHConfig: ~/.ssh/config, the system file and every file they
// Include, together) reads at most maxConfigFiles files and maxConfigBytes bytes. Each file has its bound
// (smallfile.MaxSize, 4 MiB) and Include nesting too (16 levels, as OpenSSH), but without these nothing
// bounds their number: an Include glob over a directory of thousands of files, or a file that includes
// another twice at each of the 16 levels (2^16 reads), would make one start read and parse without end.
// A real setup is a few KiB in a few dozen files, a generated one (a Host block per machine of a fleet)
// some MiB: 256 files and 16 MiB (four files at the per-file bound) leave room for those many times over,
// while a wrong one costs at most that much time and memory (and one file more, read to be refused).
// Variables for tests.
var (
	maxConfigFiles       = 256
	maxConfigBytes int64 = 16 << 20
)

// configReadOrder says, in the bounds' errors, that the file named is the one that crossed a bound shared with
// the files read before it: a system file may be named for a ~/.ssh/config that took nearly all of it.
const configReadOrder = "~/.ssh/config and its Includes, then the system file and its; or -F's file and its"

// configBudget is what one reading of the config files has read so far: files, and bytes in all.
type configBudget struct {
	files int
	bytes int64
}

// readConfigFile reads one ssh_config file and, recursively, the files its Include lines name. system says
// it is /etc/ssh/ssh_config or one of its includes (relative Include paths are then under /etc/ssh);
// depth counts the Includes that led here. checkOwner refuses a file that another user could have written,
// as OpenSSH does for ~/.ssh/config and every included file: their ProxyCommand and Match exec lines run
// as the user. budget counts the files and bytes read, from every file of this reading of the config.
func readConfigFile(path string, system, checkOwner bool, depth int, budget *configBudget) (*configFile, error) {
	// OpenSSH's READCONF_MAX_DEPTH: a loop of Includes ends here.
	if depth > 16 {
		return nil, fmt.Errorf("ssh config %s: too many nested Include levels", path)
	}
	// The file that would be one too many is not opened; the one that passes the bytes is read (at most
	// smallfile.MaxSize) before it is refused.
	if budget.files++; budget.files > maxConfigFiles {
		return nil, fmt.Errorf("ssh config %s: the config files and all they Include make more than %d files (counted in the order read: %s)", path, maxConfigFiles, configReadOrder)
	}
	data, err := readConfigBytes(path, checkOwner)
	if err != nil {
		return nil, fmt.Errorf("ssh config %s: %w", path, err)
	}
	if budget.bytes += int64(len(data)); budget.bytes > maxConfigBytes {
		return nil, fmt.Errorf("ssh config %s: the config files and all they Include make more than %d MiB (counted in the order read: %s)", path, maxConfigBytes>>20, configReadOrder)
	}
	f := &configFile{path: path}
	// The parser reads the settings; Match and Include lines, which it would evaluate its own way, are
	// read here and blanked for it, keeping the line numbers.
	raw := bytes.Split(data, []byte("\n"))
	for i, text := range raw {
		keyword, rest := configKeyword(string(text))
		switch strings.ToLower(keyword) {
		case "host", "match", "include":
		default:
			continue
		}
		words, err := configWords(rest)
		if err != nil {
			return nil, fmt.Errorf("ssh config %s line %d: %w", path, i+1, err)
		}
		switch strings.ToLower(keyword) {
		case "host":
			f.lines = append(f.lines, configLine{kind: hostLine, line: i + 1, hosts: words})
		case "match":
			criteria, err := parseMatch(words)
			if err != nil {
				return nil, fmt.Errorf("ssh config %s line %d: %w", path, i+1, err)
			}
			f.lines = append(f.lines, configLine{kind: matchLine, line: i + 1, match: criteria})
			raw[i] = nil
		case "include":
			l := configLine{kind: includeLine, line: i + 1}
			for _, pattern := range words {
				inc, err := includePaths(pattern, system)
				if err != nil {
					return nil, fmt.Errorf("ssh config %s line %d: %w", path, i+1, err)
				}
				for _, p := range inc {
					cf, err := readConfigFile(p, system, true, depth+1, budget)
					if err != nil {
						return nil, err
					}
					l.included = append(l.included, cf)
				}
			}
			f.lines = append(f.lines, l)
			raw[i] = nil
		}
	}
	cfg, err := ssh_config.DecodeBytes(bytes.Join(raw, []byte("\n")))
	if err != nil {
		return nil, &unparsedError{fmt.Errorf("ssh config %s: %w", path, err)}
	}
	var settings []configLine
	for _, h := range cfg.Hosts {
		for _, n := range h.Nodes {
			if kv, ok := n.(*ssh_config.KV); ok {
				settings = append(settings, configLine{line: kv.Pos().Line, key: kv.Key, value: kv.Value})
			}
		}
	}
	f.lines = append(f.lines, settings...)
	slices.SortStableFunc(f.lines, func(a, b configLine) int { return a.line - b.line })
	return f, nil
}

// unparsedError is a config file the ssh_config parser refused.
type unparsedError struct{ error }

func (e *unparsedError) Unwrap() error { return e.error }

// readConfigBytes reads a config file, checking the file it opened when checkOwner is set (OpenSSH's "Bad
// owner or permissions").
func readConfigBytes(path string, checkOwner bool) ([]byte, error) {
	data, fi, err := smallfile.ReadInfo(path)
	if err != nil {
		return nil, err
	}
	if checkOwner {
		if err := othersCannotWrite(fi, path); err != nil {
			return nil, err
		}
	}
	return data, nil
}

// othersCannotWrite refuses a file that a user other than the running one or root may have written: owned
// by another user, writable by others, or writable by a group with another member. A group-writable file
// passes when its group is the running user's own (no other member, as a user's private group), which
// Debian's and Ubuntu's ssh accept too: with their default umask 002, ~/.ssh/config is often mode 0664.
func othersCannotWrite(fi os.FileInfo, path string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	mode := fi.Mode().Perm()
	switch {
	case st.Uid != 0 && int(st.Uid) != os.Getuid():
		return fmt.Errorf("bad owner: owned by uid %d, not by you or root, and its commands would run as you", st.Uid)
	case mode&0o002 != 0, mode&0o020 != 0 && !privateGroup(st.Gid, uint32(os.Getuid())):
		return fmt.Errorf("bad permissions %04o: writable by others than you, whose commands would run as you (chmod go-w %s)", mode, path)
	}
	return nil
}

// privateGroup says whether group gid has owner (the running user, as in Debian's ssh) as its only member:
// the only user whose primary group it is, and no other listed member. Read from /etc/passwd and
// /etc/group, not through NSS: a group found in neither is not private.
func privateGroup(gid, owner uint32) bool {
	members := 0
	passwd, _ := os.ReadFile("/etc/passwd")
	ownerName := ""
	for _, line := range strings.Split(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 4 {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if uint32(uid) == owner && ownerName == "" {
			ownerName = f[0]
		}
		if uint32(g) == gid {
			if uint32(uid) != owner {
				return false
			}
			members++
		}
	}
	group, _ := os.ReadFile("/etc/group")
	for _, line := range strings.Split(string(group), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[2] != strconv.FormatUint(uint64(gid), 10) || f[3] == "" {
			continue
		}
		for _, m := range strings.Split(f[3], ",") {
			if m != ownerName {
				return false
			}
			members++
		}
	}
	return members > 0
}

// includePaths are the files an Include pattern names, as OpenSSH finds them: a relative path is under
// ~/.ssh (under /etc/ssh for the system file), and a glob's files come in name order. None is no error.
func includePaths(pattern string, system bool) ([]string, error) {
	switch {
	case strings.HasPrefix(pattern, "~"):
		if system {
			return nil, fmt.Errorf("Include %s: ~ is not allowed in the system file", pattern)
		}
		if !strings.HasPrefix(pattern, "~/") {
			return nil, fmt.Errorf("Include %s: only ~/ is supported", pattern)
		}
		home, err := homeDir()
		if err != nil {
			return nil, fmt.Errorf("Include %s: %w", pattern, err)
		}
		pattern = filepath.Join(home, pattern[2:])
	case filepath.IsAbs(pattern):
	case system:
		pattern = filepath.Join("/etc/ssh", pattern)
	default:
		home, err := homeDir()
		if err != nil {
			return nil, fmt.Errorf("Include %s: %w", pattern, err)
		}
		pattern = filepath.Join(home, ".ssh", pattern)
	}
	return filepath.Glob(pattern)
}

// configKeyword splits a config line as OpenSSH does: the keyword, then, after spaces or "=", the rest.
func configKeyword(line string) (keyword, rest string) {
	line = strings.TrimLeft(line, " \t\r")
	end := strings.IndexAny(line, " \t\r=")
	if end < 0 {
		end = len(line)
	}
	keyword, rest = line[:end], strings.TrimLeft(line[end:], " \t\r")
	if strings.HasPrefix(rest, "=") {
		rest = strings.TrimLeft(rest[1:], " \t\r")
	}
	return keyword, rest
}

// configWords splits the rest of a Host, Match or Include line into words as OpenSSH's argv_split does:
// separated by spaces and tabs, up to a word that starts with "#"; a quoted part ("..." or '...') anywhere
// in a word keeps its spaces and loses its quotes, and a backslash escapes a backslash, a quote, or outside
// quotes a space. Trailing white space is not part of the line, as for ssh.
func configWords(rest string) ([]string, error) {
	rest = strings.TrimRight(rest, " \t\r\n\f")
	var words []string
	for i := 0; i < len(rest); i++ {
		if rest[i] == ' ' || rest[i] == '\t' {
			continue
		}
		if rest[i] == '#' {
			break
		}
		var w strings.Builder
		var quote byte
	word:
		for ; i < len(rest); i++ {
			switch c := rest[i]; {
			case c == '\\' && i+1 < len(rest) && (strings.IndexByte(`\'"`, rest[i+1]) >= 0 || quote == 0 && rest[i+1] == ' '):
				i++
				w.WriteByte(rest[i])
			case quote == 0 && (c == ' ' || c == '\t'):
				break word
			case quote == 0 && (c == '"' || c == '\''):
				quote = c
			case quote != 0 && c == quote:
				quote = 0
			default:
				w.WriteByte(c)
			}
		}
		if quote != 0 {
			return nil, errors.New("unterminated quote")
		}
		words = append(words, w.String())
	}
	return words, nil
}

// unevaluatedCriteria are the Match criteria of newer OpenSSH releases that konnect does not evaluate:
// a block that depends on one is skipped, with a warning, rather than applied on a guess.
var unevaluatedCriteria = map[string]bool{"localnetwork": true, "tagged": true, "version": true, "sessiontype": true, "command": true}

// parseMatch reads the criteria of a Match line, refusing what OpenSSH refuses: no criterion, "all" with
// others, a criterion without its argument, and a criterion no OpenSSH release knows.
func parseMatch(words []string) ([]matchCriterion, error) {
	var out []matchCriterion
	for i := 0; i < len(words); i++ {
		c := matchCriterion{name: strings.ToLower(words[i])}
		if strings.HasPrefix(c.name, "!") {
			c.negate, c.name = true, c.name[1:]
		}
		switch c.name {
		case "all":
			if len(out) > 1 || i+1 < len(words) {
				return nil, errors.New(`Match: "all" cannot be combined with other criteria`)
			}
		case "canonical", "final":
		case "host", "originalhost", "user", "localuser", "exec":
		default:
			if !unevaluatedCriteria[c.name] {
				return nil, fmt.Errorf("Match: unknown criterion %q", words[i])
			}
		}
		if c.name != "all" && c.name != "canonical" && c.name != "final" {
			if i+1 == len(words) {
				return nil, fmt.Errorf("Match: %s needs an argument", words[i])
			}
			i++
			c.arg = words[i]
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("Match needs at least one criterion")
	}
	return out, nil
}

// matchTarget is what a Match line looks at: the host as given and the settings read so far.
type matchTarget struct {
	originalHost string // as given on the command line (%n)
	hostName     string // HostName read so far, %h expanded; "" until one is read
	user         string // the remote user: -l, the destination's, else User read so far; "" until one is
	port         int    // -p, the destination's, else Port read so far; 0 until one is
	hostKeyAlias string // HostKeyAlias read so far (%k)
	final        bool   // the final pass, after a "Match final"
}

// host is what "Match host" and Match exec's %h see: the HostName read so far, else the host as given.
func (t *matchTarget) host() string {
	if t.hostName != "" {
		return t.hostName
	}
	return t.originalHost
}

// remoteUser is what "Match user" and %r see: the user so far, else the local user, as OpenSSH's default.
func (t *matchTarget) remoteUser() string {
	if t.user != "" {
		return t.user
	}
	return localUser()
}

// setting is one line of a config file that applies to a host.
type setting struct {
	file  string
	line  int
	key   string
	value string
}

// hostSettings are the settings that apply to one host, in the order OpenSSH reads them; nil means none.
type hostSettings struct {
	settings []setting
}

// evaluation is one host's reading of the config files.
type evaluation struct {
	target    matchTarget
	applied   []setting
	wantFinal bool // a "final" criterion was read: OpenSSH then reads the files once more
	ctx       context.Context
	log       logr.Logger
	warned    map[string]bool // sshConfig.warned
}

// forHost reads the config files for alias, as given with user and port (from -l, -p or the destination;
// "" and 0 if not given). OpenSSH reads the files a second time, with "final" and "canonical" true and Host
// lines matching the HostName in lower case, when any "final" criterion was read (konnect never
// canonicalizes host names, as OpenSSH with its default CanonicalizeHostname no); settings already read
// keep winning.
func (c *sshConfig) forHost(alias, user string, port int) (*hostSettings, error) {
	if c == nil {
		return &hostSettings{}, nil
	}
	if c.warned == nil {
		c.warned = map[string]bool{}
	}
	ctx := c.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	ev := &evaluation{target: matchTarget{originalHost: alias, user: user, port: port}, ctx: ctx, log: c.log, warned: c.warned}
	for _, f := range c.files {
		if err := ev.read(f, true, false); err != nil {
			return nil, err
		}
	}
	if ev.wantFinal {
		// As ssh: the final pass sees the host name read so far, lowercased unless it is an address, as
		// its Host lines, "Match host" and Match exec's %h, %k and %C do.
		ev.target.final = true
		ev.target.hostName = lowerHostName(ev.target.host())
		for _, f := range c.files {
			if err := ev.read(f, true, false); err != nil {
				return nil, err
			}
		}
	}
	return &hostSettings{settings: ev.applied}, nil
}

// read evaluates one file. active says whether the lines before its first Host or Match apply (those of
// the including block); neverMatch that no block of it applies, as in a file included by a block that does
// not apply.
func (ev *evaluation) read(f *configFile, active, neverMatch bool) error {
	for _, l := range f.lines {
		switch l.kind {
		case hostLine:
			name := ev.target.originalHost
			if ev.target.final {
				name = ev.target.host()
			}
			active = !neverMatch && matchPatterns(name, l.hosts, false)
		case matchLine:
			// Evaluated even where it cannot apply, as OpenSSH does: its exec runs, its "final" counts.
			ok, err := ev.match(f.path, l.line, l.match, !neverMatch)
			if err != nil {
				return err
			}
			active = ok && !neverMatch
		case includeLine:
			for _, inc := range l.included {
				if err := ev.read(inc, active, neverMatch || !active); err != nil {
					return err
				}
			}
		case settingLine:
			if active {
				ev.set(setting{file: f.path, line: l.line, key: l.key, value: l.value})
			}
		}
	}
	return nil
}

// set applies a setting, and records what later Match lines look at.
func (ev *evaluation) set(s setting) {
	t := &ev.target
	// ssh takes the host name before the final pass: a HostName read in it is ignored.
	if t.final && strings.EqualFold(s.key, "hostname") {
		return
	}
	ev.applied = append(ev.applied, s)
	switch strings.ToLower(s.key) {
	case "hostname":
		if t.hostName == "" {
			t.hostName = expandHostName(s.value, t.originalHost)
		}
	case "user":
		if t.user == "" {
			t.user = s.value
		}
	case "port":
		if n, err := parsePort(s.value); err == nil && t.port == 0 {
			t.port = n
		}
	case "hostkeyalias":
		if t.hostKeyAlias == "" {
			t.hostKeyAlias = s.value
		}
	}
}

// lowerHostName is host lowercased, as ssh takes the host name it connects to after reading its config
// files; an address (FE80::A) it leaves as it is.
func lowerHostName(host string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return host
	}
	return strings.ToLower(host)
}

// expandHostName expands the tokens of a HostName value for a host given as alias, as OpenSSH does.
func expandHostName(value, alias string) string {
	return strings.NewReplacer("%%", "%", "%h", alias).Replace(value)
}

// match evaluates the criteria of the Match line at file:line, all of which must hold. As in OpenSSH, an
// exec runs only when the criteria before it hold. warn reports a criterion konnect cannot evaluate, which
// is pointless where the block cannot apply anyway.
func (ev *evaluation) match(file string, line int, criteria []matchCriterion, warn bool) (bool, error) {
	t := &ev.target
	result := true
	for _, c := range criteria {
		var r bool
		switch c.name {
		case "all":
			r = true
		case "canonical", "final":
			if c.name == "final" {
				ev.wantFinal = true
			}
			r = t.final
		case "host":
			r = matchPatterns(strings.ToLower(t.host()), strings.Split(c.arg, ","), true)
		case "originalhost":
			r = matchPatterns(strings.ToLower(t.originalHost), strings.Split(c.arg, ","), true)
		case "user":
			r = matchPatterns(t.remoteUser(), strings.Split(c.arg, ","), false)
		case "localuser":
			r = matchPatterns(localUser(), strings.Split(c.arg, ","), false)
		case "exec":
			if !result {
				continue
			}
			var err error
			if r, err = ev.exec(c.arg); err != nil {
				return false, fmt.Errorf("ssh config %s line %d: Match exec: %w", file, line, err)
			}
		default:
			if where := file + ":" + strconv.Itoa(line); result && warn && !ev.warned[where] {
				ev.warned[where] = true
				ev.log.Info("Skipping a Match block of the SSH config file: konnect cannot evaluate "+c.name+", so none of its settings apply",
					"file", file, "line", line, "host", t.originalHost)
			}
			result = false
			continue
		}
		if r == c.negate {
			result = false
		}
	}
	return result, nil
}

// exec runs a Match exec command as OpenSSH does, through the user's shell with its tokens expanded; it
// holds when the command exits 0.
func (ev *evaluation) exec(command string) (bool, error) {
	t := &ev.target
	local, _ := os.Hostname()
	short, _, _ := strings.Cut(local, ".")
	port := t.port
	if port == 0 {
		port = 22
	}
	home, _ := homeDir()
	keyAlias := t.hostKeyAlias
	if keyAlias == "" {
		keyAlias = t.host()
	}
	connHash := sha1.Sum([]byte(local + t.host() + strconv.Itoa(port) + t.remoteUser()))
	cmd, err := expandTokens(command, map[byte]string{
		'C': hex.EncodeToString(connHash[:]), 'L': short, 'd': home, 'h': t.host(), 'k': keyAlias, 'l': local,
		'n': t.originalHost, 'p': strconv.Itoa(port), 'r': t.remoteUser(), 'u': localUser(), 'i': strconv.Itoa(os.Getuid()),
	})
	if err != nil {
		return false, err
	}
	shell := os.Getenv("SHELL")
	if shell == "" {
		shell = "/bin/sh"
	}
	var stderr bytes.Buffer
	c := exec.CommandContext(ev.ctx, shell, "-c", cmd)
	c.Stderr = &stderr
	// When ctx ends, the shell and what it started are killed.
	c.Cancel = func() error { return killTree(c.Process.Pid) }
	// As ssh, wait for the shell alone: a child it leaves in the background keeps the stderr pipe open.
	c.WaitDelay = time.Second
	err = c.Run()
	if ctxErr := ev.ctx.Err(); ctxErr != nil {
		return false, fmt.Errorf("%q: %w", cmd, ctxErr)
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		ev.log.Info("Match exec wrote to stderr", "command", cmd, "stderr", s)
	}
	var exit *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		return true, nil
	case errors.As(err, &exit) && exit.Exited():
		return false, nil
	}
	return false, fmt.Errorf("%q: %w", cmd, err)
}

// expandTokens replaces each %x of s by tokens[x], and %% by %; another token is an error.
func expandTokens(s string, tokens map[byte]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i++; i == len(s) {
			return "", fmt.Errorf("%q ends with a lone %%", s)
		}
		if s[i] == '%' {
			b.WriteByte('%')
		} else if v, ok := tokens[s[i]]; ok {
			b.WriteString(v)
		} else {
			return "", fmt.Errorf("%q: unknown token %%%c", s, s[i])
		}
	}
	return b.String(), nil
}

// matchPatterns says whether s matches a pattern list as OpenSSH's: some pattern matches, and no negated
// ("!") one does. fold compares without case, as for host names.
func matchPatterns(s string, patterns []string, fold bool) bool {
	found := false
	for _, p := range patterns {
		negated := strings.HasPrefix(p, "!")
		if negated {
			p = p[1:]
		}
		if fold {
			p = strings.ToLower(p)
		}
		if matchWildcard(p, s) {
			if negated {
				return false
			}
			found = true
		}
	}
	return found
}

// first returns which of keys applies first, and its value, file and line: OpenSSH takes the first value it
// reads of each keyword, and of ProxyJump and ProxyCommand whichever comes first.
func (h *hostSettings) first(keys ...string) (key, value, file string, line int) {
	for _, k := range keys {
		readsKeyword(k)
	}
	if h == nil {
		return "", "", "", 0
	}
	for _, s := range h.settings {
		for _, k := range keys {
			if strings.EqualFold(s.key, k) && s.value != "" {
				return k, s.value, s.file, s.line
			}
		}
	}
	return "", "", "", 0
}

// get is the value of key that applies, "" if none.
func (h *hostSettings) get(key string) string {
	_, v, _, _ := h.first(key)
	return v
}

// getAll is every value of key that applies, in order, each once, as OpenSSH keeps IdentityFile and
// CertificateFile.
func (h *hostSettings) getAll(key string) []string {
	readsKeyword(key)
	if h == nil {
		return nil
	}
	var out []string
	for _, s := range h.settings {
		if strings.EqualFold(s.key, key) && s.value != "" && !slices.Contains(out, s.value) {
			out = append(out, s.value)
		}
	}
	return out
}

// systemConfigFile is OpenSSH's system-wide client config; a variable for tests.
var systemConfigFile = "/etc/ssh/ssh_config"

// loadSSHConfig reads the config file path (ssh -F): "" means ~/.ssh/config, then /etc/ssh/ssh_config, each
// skipped when absent; "none" means none.
func loadSSHConfig(path string, log logr.Logger) (*sshConfig, error) {
	type source struct {
		path             string
		explicit, system bool
	}
	var sources []source
	switch path {
	case "none":
		return nil, nil
	case "":
		if home, err := homeDir(); err == nil {
			sources = append(sources, source{path: filepath.Join(home, ".ssh", "config")})
		}
		sources = append(sources, source{path: systemConfigFile, system: true})
	default:
		sources = []source{{path: path, explicit: true}}
	}
	out := &sshConfig{log: log}
	var budget configBudget // the files and all they include, together
	for _, s := range sources {
		if _, err := os.Stat(s.path); !s.explicit && errors.Is(err, os.ErrNotExist) {
			continue
		}
		// As OpenSSH: ~/.ssh/config is checked, a file named by -F and the system file are not.
		f, err := readConfigFile(s.path, s.system, !s.explicit && !s.system, 0, &budget)
		if err != nil {
			// The system file may use directives the parser does not know; it is optional here, and said
			// so. Any other fault in it (an unknown Match criterion, an included file others may write)
			// stops the start, as it stops ssh.
			var unparsed *unparsedError
			if s.system && errors.As(err, &unparsed) {
				log.Info("Skipping the system SSH config file: konnect cannot parse it", "file", s.path, "err", err.Error())
				continue
			}
			return nil, err
		}
		out.files = append(out.files, f)
	}
	return out, nil
}
