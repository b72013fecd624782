package reliability

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func proxyURLs(t *testing.T, kubeconfig string) map[string]string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatalf("%s no longer loads: %v", kubeconfig, err)
	}
	out := map[string]string{}
	for name, c := range cfg.Clusters {
		out[name] = c.ProxyURL
	}
	return out
}

// TestKubeconfigSetProxyRefusesForeignLink: a kubeconfig that is a symlink another user owns, or that leads
// through one, is refused, naming the file, and the file it leads to is not changed; set-proxy used to
// resolve the link itself and write through it. A link of one's own is still written through.
func TestKubeconfigSetProxyRefusesForeignLink(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name string
		// plant returns the path to give --kubeconfig, and what the refusal must name besides it.
		plant func(t *testing.T, home, victim string) (string, []string)
	}{
		{"another user's link", func(t *testing.T, home, victim string) (string, []string) {
			link := foreignLink(t, victim, filepath.Join(home, "config"))
			return link, []string{"symlink " + link + " belongs to uid 65534"}
		}},
		{"our link to another user's link", func(t *testing.T, home, victim string) (string, []string) {
			theirs := foreignLink(t, victim, filepath.Join(home, "theirs"))
			link := filepath.Join(home, "config")
			if err := os.Symlink(theirs, link); err != nil {
				t.Fatal(err)
			}
			return link, []string{"symlink " + theirs + " belongs to uid 65534"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := shortDir(t)
			victim := filepath.Join(shortDir(t), "victim")
			writeFile(t, victim, testKubeconfig)
			kc, want := c.plant(t, home, victim)
			before := snapshot(t, filepath.Dir(victim))
			r := konnect(t, time.Minute, "kubeconfig", "set-proxy", "--kubeconfig", kc, "--context", "dev", "--proxy-url", "socks5://127.0.0.1:1080")
			checkRefused(t, r, append(want, "--kubeconfig", kc), "")
			if d := diffSnapshots(before, snapshot(t, filepath.Dir(victim))); len(d) > 0 {
				t.Errorf("the refused set-proxy changed %v", d)
			}
		})
	}
	t.Run("our own link", func(t *testing.T) {
		home, dotfiles := shortDir(t), shortDir(t)
		target := filepath.Join(dotfiles, "kubeconfig")
		writeFile(t, target, testKubeconfig)
		link := filepath.Join(home, "config")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if r := konnect(t, time.Minute, "kubeconfig", "set-proxy", "--kubeconfig", link, "--context", "dev", "--proxy-url", "socks5://127.0.0.1:1080"); r.code != 0 {
			t.Fatalf("%s", r)
		}
		if got := proxyURLs(t, target)["dev"]; got != "socks5://127.0.0.1:1080" {
			t.Errorf("the file the link leads to has proxy-url %q", got)
		}
	})
}

// foreignLink makes link, a symlink to target that another user owns.
func foreignLink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	return link
}
