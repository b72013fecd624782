package apiproxy

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/konnect-dev/konnect/pki/field"
	"k8s.io/klog/v2"
)

// Defaults of the filter, spelled as kubectl spells them on its command line: kubectl proxy's, except that
// DefaultRejectPaths also refuses the node proxy's way to the same calls.
const (
	// DefaultAcceptHosts accepts only Host headers that name the loopback interface, which is what defeats
	// DNS rebinding (kubernetes issue 8871): a page served from evil.example that rebinds its name to
	// 127.0.0.1 still sends "Host: evil.example".
	DefaultAcceptHosts = `^localhost$,^127\.0\.0\.1$,^\[::1\]$`
	// DefaultAcceptPaths accepts every path.
	DefaultAcceptPaths = `^.*`
	// KubectlRejectPaths is kubectl proxy's default --reject-paths: exec and attach, the two calls that
	// run commands in a pod.
	KubectlRejectPaths = `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach`
	// NodeProxyRejectPaths refuses the kubelet API's exec, attach, run and portForward reached through a
	// node's proxy subresource (/api/v1/nodes/NODE[:PORT]/proxy/exec/NS/POD/CONTAINER, ...), which
	// kube-apiserver forwards to the kubelet as they are: they run commands in any pod on the node, and
	// kubectl's default lets them through. It refuses checkpoint too, which writes a container's memory to
	// the node's disk, and debug/flags, which changes the kubelet's log verbosity for everyone; the
	// read-only debug/pprof stays open.
	NodeProxyRejectPaths = `^/api/v1/nodes/[^/]+/proxy/(exec|attach|run|portForward|checkpoint|debug/flags)(/|$)`
	// DefaultRejectPaths is kubectl's, and the node proxy's way to the same.
	DefaultRejectPaths = KubectlRejectPaths + "," + NodeProxyRejectPaths
	// DefaultRejectMethods refuses no method.
	DefaultRejectMethods = `^$`
)

// Filter decides which requests reach the API server. It has kubectl proxy's semantics: a request passes
// when its path matches no RejectPaths pattern, its method matches no RejectMethods pattern, its path
// matches an AcceptPaths pattern and its host (the Host header without the port) matches an AcceptHosts
// pattern. In addition, a browser's Origin header must name an accepted host (see AllowsOrigin).
// Everything else gets 403 Forbidden.
//
// Unlike kubectl's, the patterns match the path as the API server will route it (see RoutedPath), and a
// path that cannot be read one way only, which a hop in between could read another way, gets 400 Bad
// Request: kubectl proxy forwards /%2e/api/v1/namespaces/d/pods/p/exec, which its exec filter does not
// match and any hop that normalises paths turns into a pod exec.
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

// DefaultFilterSpec returns konnect proxy's default filter: kubectl proxy's, and NodeProxyRejectPaths.
func DefaultFilterSpec() FilterSpec {
	return FilterSpec{
		AcceptPaths:   DefaultAcceptPaths,
		RejectPaths:   DefaultRejectPaths,
		AcceptHosts:   DefaultAcceptHosts,
		RejectMethods: DefaultRejectMethods,
	}
}

// Compile compiles every list. An error is a *field.Error naming the FilterSpec field that failed.
func (s FilterSpec) Compile() (*Filter, error) {
	var f Filter
	for _, l := range []struct {
		field string
		src   string
		dst   *[]*regexp.Regexp
	}{
		{"AcceptPaths", s.AcceptPaths, &f.AcceptPaths},
		{"RejectPaths", s.RejectPaths, &f.RejectPaths},
		{"AcceptHosts", s.AcceptHosts, &f.AcceptHosts},
		{"RejectMethods", s.RejectMethods, &f.RejectMethods},
	} {
		res, err := ParseRegexps(l.src)
		if err != nil {
			return nil, field.Wrap(l.field, err)
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

// refusal says which of the filter's rules refuses a request that Allows or AllowsOrigin refused, in the
// order Allows applies them.
func (f *Filter) refusal(method, path, hostHeader, origin string) string {
	switch {
	case matchAny(path, f.RejectPaths):
		return fmt.Sprintf("the request filter refuses the path %s (--reject-paths)", path)
	case matchAny(method, f.RejectMethods):
		return fmt.Sprintf("the request filter refuses the method %s (--reject-methods)", method)
	case !matchAny(path, f.AcceptPaths):
		return fmt.Sprintf("the request filter does not accept the path %s (--accept-paths)", path)
	case !f.allowsHost(hostHeader):
		return fmt.Sprintf("the request filter does not accept the Host header %q (--accept-hosts)", hostHeader)
	default:
		return fmt.Sprintf("the request filter does not accept a request from a page of origin %q (--accept-hosts)", origin)
	}
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

// Wrap returns a handler that serves the requests f allows with next, answers the others with 403, and a
// path that RoutedPath refuses with 400, each with a Status that says why (writeStatus).
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		escaped := r.URL.EscapedPath() // what is forwarded
		path, err := RoutedPath(escaped)
		if err != nil {
			klog.V(2).InfoS("Request rejected by filter: ambiguous path", "method", r.Method, "path", escaped, "reason", err)
			writeStatus(w, http.StatusBadRequest, "konnect proxy: "+err.Error())
			return
		}
		origin := r.Header.Get("Origin")
		if !f.Allows(r.Method, path, r.Host) || !f.AllowsOrigin(origin) {
			klog.V(2).InfoS("Request rejected by filter", "method", r.Method, "path", path, "host", r.Host, "origin", origin)
			writeStatus(w, http.StatusForbidden, "konnect proxy: "+f.refusal(r.Method, path, r.Host, origin))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// RoutedPath returns the path that the API server routes a request for the escaped (as sent) path by:
// decoded once, as Go's HTTP server and so kube-apiserver decode it. It refuses a path that does not mean
// that one path to every reader, because some proxy, load balancer or server on the way may decode it
// again, clean it, or drop what it takes for decoration, and so reach what the filter refused:
//   - an encoded "/", "\", ".", "%" (encoded twice), ";", "?" or "#": decoded by a hop, each changes
//     the path's segments or ends it;
//   - a "\", ";", "?" or "#" as sent (Go's URL never holds the last two in an escaped path): some servers
//     read "\" as "/" and drop ";parameters" from a segment;
//   - an empty segment ("//"), a "." or ".." segment, or a segment that ends in "." or begins or ends with a
//     space, which some servers trim;
//   - control characters, and bytes outside ASCII (an overlong or fullwidth "." among them), which
//     Kubernetes names never hold;
//   - anything but an absolute path.
//
// What passes decodes to itself once more and is clean, so every hop reads the same path.
func RoutedPath(escaped string) (string, error) {
	if !strings.HasPrefix(escaped, "/") {
		return "", fmt.Errorf("path %q is not absolute", escaped)
	}
	var b strings.Builder
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		if c == '%' {
			if i+2 >= len(escaped) || !isHex(escaped[i+1]) || !isHex(escaped[i+2]) {
				return "", fmt.Errorf("path %q: %q is not a percent-encoded byte", escaped, escaped[i:min(i+3, len(escaped))])
			}
			d := unhex(escaped[i+1])<<4 | unhex(escaped[i+2])
			if strings.IndexByte(`/\.%;?#`, d) >= 0 {
				return "", fmt.Errorf("path %q: %q encodes %q, which a hop that decodes the path again reads differently", escaped, escaped[i:i+3], string(d))
			}
			c = d
			i += 2
		} else if strings.IndexByte(`\;?#`, c) >= 0 {
			return "", fmt.Errorf("path %q holds %q, which some servers read as a path separator or the start of parameters, a query or a fragment", escaped, string(c))
		}
		if c < 0x20 || c >= 0x7f {
			return "", fmt.Errorf("path %q holds a control character or a byte outside ASCII", escaped)
		}
		b.WriteByte(c)
	}
	path := b.String()
	segments := strings.Split(path[1:], "/")
	for i, seg := range segments {
		switch {
		case seg == "" && i == len(segments)-1: // a trailing slash
		case seg == "":
			return "", fmt.Errorf("path %q has an empty segment (//)", escaped)
		case seg == "." || seg == "..":
			return "", fmt.Errorf("path %q has a %q segment", escaped, seg)
		case strings.HasSuffix(seg, ".") || strings.HasSuffix(seg, " ") || strings.HasPrefix(seg, " "):
			return "", fmt.Errorf("path %q has a segment %q that some servers trim", escaped, seg)
		}
	}
	return path, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
