package apiproxy

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

// hostileNormalise reads an escaped path as the most forgiving hop on the way might: decoding until
// nothing changes, taking "\" for "/", dropping ";parameters" from segments and trailing dots and white
// space from them, and resolving "." and "..". A path the filter lets through must mean the same to it as
// to the filter.
func hostileNormalise(escaped string) string {
	p := escaped
	for range 4 {
		d, err := url.PathUnescape(p)
		if err != nil || d == p {
			break
		}
		p = d
	}
	p = strings.ReplaceAll(p, `\`, "/")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			s = s[:j]
		}
		if j := strings.IndexAny(s, "?#"); j >= 0 {
			s = s[:j]
		}
		if s != "." && s != ".." {
			s = strings.TrimRight(s, ". \t")
		}
		segs[i] = s
	}
	p = strings.Join(segs, "/")
	trailing := strings.HasSuffix(p, "/")
	p = path.Clean("/" + p)
	if trailing && p != "/" {
		p += "/"
	}
	return p
}

func TestRoutedPath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/", "/"},
		{"/api", "/api"},
		{"/api/", "/api/"},
		{"/api/v1/namespaces/default/pods", "/api/v1/namespaces/default/pods"},
		{"/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt"},
		{"/api/v1/namespaces/d/services/http:web:80/proxy/", "/api/v1/namespaces/d/services/http:web:80/proxy/"},
		{"/api/v1/namespaces/d/services/http%3Aweb%3A80/proxy/a%20b", "/api/v1/namespaces/d/services/http:web:80/proxy/a b"},
		{"/api/v1/namespaces/d/pods/p/ex%65c", "/api/v1/namespaces/d/pods/p/exec"},
		{"/apis/wardle.example.com/v1alpha1/namespaces/default/flunders", "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders"},
		{"/.well-known/openid-configuration", "/.well-known/openid-configuration"},
	} {
		if got, err := RoutedPath(c.in); err != nil || got != c.want {
			t.Errorf("RoutedPath(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range append(bypassPaths(), "", "api", "*", "/a%", "/a%2", "/a%zz", "/a\x00b", "/caf\xc3\xa9") {
		if got, err := RoutedPath(in); err == nil {
			t.Errorf("RoutedPath(%q) = %q, want a refusal", in, got)
		}
	}
}

// bypassPaths are spellings of an exec request (and one of a path outside an accepted namespace) that a
// filter on the raw or half-decoded path could miss and a hop that reads paths more loosely could turn into
// the exec; some of them only a raw request line can carry.
func bypassPaths() []string {
	const execPath = "/api/v1/namespaces/d/pods/p/exec"
	return []string{
		"/%2e" + execPath + "?command=id", // the review's
		"/%2E" + execPath,
		"/%2e%2e" + execPath,
		"/.%2e" + execPath,
		"/%2e." + execPath,
		"/x/%2e%2e" + execPath,
		"/x%2f..%2f" + execPath[1:],
		"/x/..%2f" + execPath[1:],
		"/x%2f%2e%2e" + execPath,
		"/api/v1/namespaces/d/pods/p/%2e/exec",
		"/api/v1/namespaces/d/pods/x/%2e%2e/p/exec",
		"/%252e" + execPath,
		"/%252e%252e" + execPath,
		"/x/%252e%252e" + execPath,
		"/%25252e" + execPath,
		"/api%2fv1/namespaces/d/pods/p/exec",
		"/x%5c..%5c" + execPath[1:],
		`/x\..\` + execPath[1:],
		`\` + execPath,
		"/api;x=y/v1/namespaces/d/pods/p/exec",
		"/api%3b/v1/namespaces/d/pods/p/exec",
		"/api./v1/namespaces/d/pods/p/exec",
		"/api%2e/v1/namespaces/d/pods/p/exec",
		"/api%20/v1/namespaces/d/pods/p/exec",
		"/%20api/v1/namespaces/d/pods/p/exec",
		"/api%09/v1/namespaces/d/pods/p/exec",
		"/api%00/v1/namespaces/d/pods/p/exec",
		"/x%3f/../api/v1/namespaces/d/pods/p/exec",
		"/x%23/%2e%2e" + execPath,
		"/%EF%BC%8E" + execPath, // fullwidth full stop
		"/%C0%AE" + execPath,    // overlong "."
		"/%u002e" + execPath,    // IIS's %u encoding
		"//api/v1/namespaces/d/pods/p/exec",
		"/./api/v1/namespaces/d/pods/p/exec",
		"/x/../api/v1/namespaces/d/pods/p/exec",
		execPath + "/.",
		"/api/v1/namespaces/d/pods/p/attach%3fstdin=true",
		"/api/v1/namespaces/public/%2e%2e/secret/pods",
		"/api/v1/namespaces/public/..%2fsecret/pods",
		"/api/v1/namespaces/public%2f..%2fsecret/pods",
		"/api/v1/namespaces/public/%252e%252e/secret/pods",
	}
}

// FuzzRoutedPath: a path RoutedPath accepts is the path decoded once, and the most forgiving hop reads it
// the same; so a filter on it sees what every hop routes by.
func FuzzRoutedPath(f *testing.F) {
	for _, p := range bypassPaths() {
		f.Add(p)
	}
	for _, p := range []string{"/api/v1/namespaces/d/pods", "/api/v1/namespaces/d/services/http%3Aweb%3A80/proxy/a%20b", "/api/", "/"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, escaped string) {
		routed, err := RoutedPath(escaped)
		if err != nil {
			return
		}
		if once, err := url.PathUnescape(escaped); err != nil || once != routed {
			t.Fatalf("RoutedPath(%q) = %q, but decoded once it is %q (%v)", escaped, routed, once, err)
		}
		if loose := hostileNormalise(escaped); loose != routed {
			t.Fatalf("RoutedPath(%q) = %q, but a forgiving hop reads %q", escaped, routed, loose)
		}
		if again, err := url.PathUnescape(routed); err != nil || again != routed {
			t.Fatalf("RoutedPath(%q) = %q decodes again to %q (%v)", escaped, routed, again, err)
		}
	})
}
