package kubeconfigcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestSetProxyHostileValues: proxy URLs, and cluster and context names, that mean something to YAML (a
// word it reads as a boolean, null or a number, ": ", " #", a leading "-", quotes, flow collections,
// unicode) survive set-proxy's edit of the file: client-go loads the proxy URL exactly as given, on the
// right cluster, and every other setting as it was. Set again, the edit replaces the line it wrote.
func TestSetProxyHostileValues(t *testing.T) {
	names := []string{"yes", "0755", "1e3", "a: b #c", "- on", "{x} [y]", `'q" "r'`, "ünï ☃ ", "null", "~"}
	kc := clientcmdapi.NewConfig()
	for i, n := range names {
		kc.Clusters[n] = &clientcmdapi.Cluster{Server: "https://198.18.0.1:" + string(rune('1'+i)) + "443"}
		kc.AuthInfos[n] = &clientcmdapi.AuthInfo{Token: n}
		kc.Contexts[n+" ctx"] = &clientcmdapi.Context{Cluster: n, AuthInfo: n}
	}
	kc.CurrentContext = names[0] + " ctx"
	orig, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	proxies := []string{
		"socks5://127.0.0.1:1080",
		"socks5://yes:0755@127.0.0.1:1080",
		"http://on:'~'@[::1]:8080",
		"https://-n:%23%20x@1e3.example:443/",
		"http://null:%7Bx%7D@ünï.example:3128",
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config")
			if err := os.WriteFile(path, orig, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, proxy := range proxies {
				if out, err := setProxy(t, "--kubeconfig", path, "--context", name+" ctx", "--proxy-url", proxy); err != nil {
					t.Fatalf("--proxy-url %q: %v\n%s", proxy, err, out)
				}
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				got, err := clientcmd.Load(data)
				if err != nil {
					t.Fatalf("--proxy-url %q: the file does not load: %v\n%s", proxy, err, data)
				}
				if p := got.Clusters[name].ProxyURL; p != proxy {
					t.Errorf("cluster %q has proxy-url %q, want %q", name, p, proxy)
				}
				got.Clusters[name].ProxyURL = ""
				if want, _ := clientcmd.Load(orig); !apiequality.Semantic.DeepEqual(got, want) {
					t.Errorf("--proxy-url %q changed other settings:\n%s", proxy, data)
				}
			}
		})
	}
	if _, err := setProxy(t, "--kubeconfig", filepath.Join(t.TempDir(), "config"), "--context", "yes ctx", "--proxy-url", "socks5://127.0.0.1:1080\nserver: x"); err == nil || !strings.Contains(err.Error(), "--proxy-url") {
		t.Errorf("a line break in --proxy-url: %v", err)
	}
}
