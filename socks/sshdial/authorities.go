package sshdial

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"net"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"
)

// authorities are the @cert-authority and @revoked lines of the known_hosts files, matched the way OpenSSH
// matches them. knownhosts matches a pattern such as "*" or "*.example.com" on port 22 only, while OpenSSH
// checks a host certificate on another port against "[host]:port" and then against the host alone, so that
// "@cert-authority *.example.com" trusts a CA on every port. Plain host keys stay with knownhosts.
type authorities struct {
	cas     []authority
	revoked map[string]bool   // marshalled keys of @revoked lines
	lines   map[fileLine]bool // the @cert-authority lines
}

// fileLine is a line of a known_hosts file, numbered from 1.
type fileLine struct {
	file string
	line int
}

type authority struct {
	patterns []string
	key      ssh.PublicKey
}

func newAuthorities() authorities {
	return authorities{revoked: map[string]bool{}, lines: map[fileLine]bool{}}
}

// add reads the marked lines of file; lines it cannot parse are left to knownhosts, which reports them.
func (a *authorities) add(file string, data []byte) {
	for i, line := range bytes.Split(data, []byte("\n")) {
		marker, hosts, key, _, _, err := ssh.ParseKnownHosts(line)
		if err != nil {
			continue
		}
		switch marker {
		case "cert-authority":
			a.cas = append(a.cas, authority{patterns: hosts, key: key})
			a.lines[fileLine{file, i + 1}] = true
		case "revoked":
			a.revoked[string(key.Marshal())] = true
		}
	}
}

// namesHost reports whether some @cert-authority line covers addr ("host:port").
func (a authorities) namesHost(addr string) bool {
	for _, ca := range a.cas {
		if ca.covers(addr) {
			return true
		}
	}
	return false
}

// vouches reports whether key is a CA that an @cert-authority line trusts for addr.
func (a authorities) vouches(key ssh.PublicKey, addr string) bool {
	for _, ca := range a.cas {
		if bytes.Equal(ca.key.Marshal(), key.Marshal()) && ca.covers(addr) {
			return true
		}
	}
	return false
}

// isCA reports whether some @cert-authority line names key, for any host.
func (a authorities) isCA(key ssh.PublicKey) bool {
	return slices.ContainsFunc(a.cas, func(ca authority) bool { return bytes.Equal(ca.key.Marshal(), key.Marshal()) })
}

// covers reports whether the line's patterns match addr under one of the names OpenSSH tries for a
// certificate: "[host]:port", then, on a port other than 22, the host alone.
func (ca authority) covers(addr string) bool {
	for _, name := range matchNames(addr) {
		if matchHost(name, ca.patterns) {
			return true
		}
	}
	return false
}

// revokes reports whether a certificate's key or its CA is marked @revoked.
func (a authorities) revokes(cert *ssh.Certificate) bool {
	return a.revoked[string(cert.Key.Marshal())] || a.revoked[string(cert.SignatureKey.Marshal())]
}

// matchNames are the names OpenSSH matches known_hosts patterns against for a host certificate, in lower
// case: the host alone on port 22; "[host]:port" on any other port, and then the host alone.
func matchNames(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []string{strings.ToLower(addr)}
	}
	host = strings.ToLower(host)
	if port == "22" {
		return []string{host}
	}
	return []string{"[" + host + "]:" + port, host}
}

// matchHost is OpenSSH's match_hostname: the host matches if a pattern does and no negated ("!") pattern
// does. A pattern is a hashed name (|1|salt|hash) or a name with * and ? wildcards.
func matchHost(host string, patterns []string) bool {
	found := false
	for _, p := range patterns {
		p, negated := strings.CutPrefix(p, "!")
		if !matchHashed(p, host) && !matchWildcard(strings.ToLower(p), host) {
			continue
		}
		if negated {
			return false
		}
		found = true
	}
	return found
}

func matchHashed(pattern, host string) bool {
	rest, ok := strings.CutPrefix(pattern, "|1|")
	if !ok {
		return false
	}
	salt64, hash64, _ := strings.Cut(rest, "|")
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil {
		return false
	}
	want, err := base64.StdEncoding.DecodeString(hash64)
	if err != nil {
		return false
	}
	mac := hmac.New(sha1.New, salt)
	mac.Write([]byte(host))
	return hmac.Equal(mac.Sum(nil), want)
}

// matchWildcard matches s against a pattern in which * is any run of characters and ? exactly one, as in
// OpenSSH's known_hosts and ssh_config patterns.
func matchWildcard(pattern, s string) bool {
	for pattern != "" {
		switch pattern[0] {
		case '*':
			for i := len(s); i >= 0; i-- {
				if matchWildcard(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		default:
			if s == "" || s[0] != pattern[0] {
				return false
			}
		}
		pattern, s = pattern[1:], s[1:]
	}
	return s == ""
}
