package apiproxy

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"k8s.io/klog/v2"
)

// Defaults of kubectl proxy's filter, spelled as kubectl spells them on its command line.
const (
	// DefaultAcceptHosts accepts only Host headers that name the loopback interface, which is what defeats
	// DNS rebinding (kubernetes issue 8871): a page served from evil.example that rebinds its name to
	// 127.0.0.1 still sends "Host: evil.example".
	DefaultAcceptHosts = `^localhost$,^127\.0\.0\.1$,^\[::1\]$`
	// DefaultAcceptPaths accepts every path.
	DefaultAcceptPaths = `^.*`
	// DefaultRejectPaths refuses exec and attach, the two calls that run commands in a pod.
	DefaultRejectPaths = `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach`
	// DefaultRejectMethods refuses no method.
	DefaultRejectMethods = `^$`
)

// Filter decides which requests reach the API server. It has kubectl proxy's semantics: a request passes
// when its path matches no RejectPaths pattern, its method matches no RejectMethods pattern, its path
// matches an AcceptPaths pattern and its host (the Host header without the port) matches an AcceptHosts
// pattern. In addition, a browser's Origin header must name an accepted host (see AllowsOrigin).
// Everything else gets 403 Forbidden.
type Filter struct {
	AcceptPaths   []*regexp.Regexp
	RejectPaths   []*regexp.Regexp
	AcceptHosts   []*regexp.Regexp
	RejectMethods []*regexp.Regexp
}

// FilterSpec is a Filter before its patterns are compiled: each field is a comma-separated list of regular
// expressions, as kubectl proxy's flags take them.
type FilterSpec struct {
	AcceptPaths   string
	RejectPaths   string
	AcceptHosts   string
	RejectMethods string
}

// DefaultFilterSpec returns kubectl proxy's default filter.
func DefaultFilterSpec() FilterSpec {
	return FilterSpec{
		AcceptPaths:   DefaultAcceptPaths,
		RejectPaths:   DefaultRejectPaths,
		AcceptHosts:   DefaultAcceptHosts,
		RejectMethods: DefaultRejectMethods,
	}
}

// Compile compiles every list. An error names the list that failed, by the name of kubectl's flag for it.
func (s FilterSpec) Compile() (*Filter, error) {
	var f Filter
	for _, l := range []struct {
		flag string
		src  string
		dst  *[]*regexp.Regexp
	}{
		{"--accept-paths", s.AcceptPaths, &f.AcceptPaths},
		{"--reject-paths", s.RejectPaths, &f.RejectPaths},
		{"--accept-hosts", s.AcceptHosts, &f.AcceptHosts},
		{"--reject-methods", s.RejectMethods, &f.RejectMethods},
	} {
		res, err := ParseRegexps(l.src)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.flag, err)
		}
		*l.dst = res
	}
	return &f, nil
}

// ParseRegexps compiles a comma-separated list of regular expressions. The empty string is the empty list,
// which matches nothing. Like kubectl, it splits on every comma, so a pattern cannot contain one.
func ParseRegexps(list string) ([]*regexp.Regexp, error) {
	if list == "" {
		return nil, nil
	}
	parts := strings.Split(list, ",")
	res := make([]*regexp.Regexp, 0, len(parts))
	for _, p := range parts {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", p, err)
		}
		res = append(res, re)
	}
	return res, nil
}

func matchAny(s string, res []*regexp.Regexp) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// Allows reports whether a request with this method, URL path and Host header may pass.
func (f *Filter) Allows(method, path, hostHeader string) bool {
	if matchAny(path, f.RejectPaths) || matchAny(method, f.RejectMethods) {
		return false
	}
	return matchAny(path, f.AcceptPaths) && f.allowsHost(hostHeader)
}

// allowsHost matches the Host header without its port, as kubectl does. kubectl then compares "::1" from
// "[::1]:8001" with its own default `^\[::1\]$` and refuses it; an IPv6 literal is therefore also tried
// in its bracketed form, which is what that default means.
func (f *Filter) allowsHost(hostHeader string) bool {
	host, _, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host = hostHeader
	}
	if matchAny(host, f.AcceptHosts) {
		return true
	}
	return strings.HasPrefix(hostHeader, "[") && host != hostHeader && matchAny("["+host+"]", f.AcceptHosts)
}

// AllowsOrigin reports whether a request with this Origin header may pass. Only browsers send one, and
// kubectl's filter ignores it: a page from evil.example cannot read the proxy's answers (the API server
// sends no CORS headers), but it can still make the browser send a cross-origin POST, or open a WebSocket,
// which browsers do not guard with CORS at all, to a service proxy or port-forward on localhost:8001. So a
// request that carries an Origin is accepted only when the origin's host passes the Host check too; clients
// that send no Origin (kubectl, curl, client-go) are not affected.
func (f *Filter) AllowsOrigin(origin string) bool {
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // including "null", sent by sandboxed frames and file:// pages
	}
	return f.allowsHost(u.Host)
}

// Wrap returns a handler that serves the requests f allows with next and answers the others with 403.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if !f.Allows(r.Method, r.URL.Path, r.Host) || !f.AllowsOrigin(origin) {
			klog.V(2).InfoS("Request rejected by filter", "method", r.Method, "path", r.URL.Path, "host", r.Host, "origin", origin)
			http.Error(w, http.StatusText(http.StatusForbidden), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
