//go:build integration

package reliability

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
)

var (
	baseDirOnce sync.Once
	baseDir     string
	baseDirErr  error
)

// initBase runs konnect init once (mTLS agents, so that every daemon has its certificates) into a
// directory shared read-only by the tests; copyBase gives each case its own copy.
func initBase(t *testing.T) string {
	t.Helper()
	baseDirOnce.Do(func() {
		dir, err := os.MkdirTemp(runDir, "base-")
		if err != nil {
			baseDirErr = err
			return
		}
		baseDir = filepath.Join(dir, "k")
		for _, args := range [][]string{initArgs(baseDir), append([]string{"init", "phase", "certs", "--agent-auth", "mtls"}, initArgs(baseDir)[1:]...)} {
			if out, err := exec.Command(konnectBin, args...).CombinedOutput(); err != nil {
				baseDirErr = fmt.Errorf("konnect %s: %w\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if baseDirErr != nil {
		t.Fatal(baseDirErr)
	}
	return baseDir
}

// copyBase copies the shared init directory (modes included) into a fresh temporary directory.
func copyBase(t *testing.T) string {
	t.Helper()
	src := initBase(t)
	dst := filepath.Join(shortDir(t), "k")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	// Files that name the directory (the flags file names the egress configuration) follow the copy.
	if r := konnect(t, time.Minute, initArgs(dst)...); r.code != 0 {
		t.Fatalf("init in the copy: %s", r)
	}
	return dst
}

func mustParseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, err := parseCertFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustParseKey(t *testing.T, path string) crypto.Signer {
	t.Helper()
	k, err := parseKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signLeaf writes certPath: a copy of the template certificate for pub, signed by (issuer, signer), valid
// over [notBefore, notAfter].
func signLeaf(t *testing.T, certPath string, tmpl *x509.Certificate, pub crypto.PublicKey, issuer *x509.Certificate, signer crypto.Signer, notBefore, notAfter time.Time) {
	t.Helper()
	c := *tmpl
	c.SerialNumber = big.NewInt(time.Now().UnixNano())
	c.NotBefore, c.NotAfter = notBefore, notAfter
	c.AuthorityKeyId = nil
	c.SignatureAlgorithm = x509.UnknownSignatureAlgorithm
	der, err := x509.CreateCertificate(rand.Reader, &c, issuer, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// testKubeconfig is a kubeconfig with one context "dev"; its server is never dialled.
const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:6443
users:
- name: dev
  user:
    token: not-a-real-token
contexts:
- name: dev
  context:
    cluster: dev
    user: dev
current-context: dev
`

// flagInError matches a flag named in an error message.
var (
	flagInError   = regexp.MustCompile(`(?:pass|run with|use|add|set) (--[a-z][a-z0-9-]+)`)
	quotedCommand = regexp.MustCompile("`[^`]*`")
)

// badInputCase is one bad input given to the CLI.
type badInputCase struct {
	name string
	// setup prepares the case and returns the arguments; watch is the directory that must not change.
	setup func(t *testing.T) (args []string, watch string)
	// want are substrings the error must contain (the flag or file, and the problem).
	want []string
	// wantFiles are files under the watched directory that the error must name by their full path (a bare
	// name such as "ca.crt" would also match inside "front-proxy-ca.crt").
	wantFiles []string
	// bug, when set, names the product bug that makes this case fail today.
	bug string
}

func badInputCases() []badInputCase {
	pki := func(dir, f string) string { return filepath.Join(dir, "pki", f) }
	initIn := func(dir string, extra ...string) []string { return append(initArgs(dir), extra...) }
	return []badInputCase{
		{
			name: "init/corrupt-pem",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				writeFile(t, pki(d, "konnectivity-server.crt"), "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
				return initIn(d), d
			},
			want: []string{"konnectivity-server.crt"},
		},
		{
			name: "certs-renew/corrupt-pem",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				writeFile(t, pki(d, "front-proxy-client.key"), "garbage\n")
				return []string{"certs", "renew", "all", "--dir", d}, d
			},
			want: []string{"front-proxy-client.key"},
		},
		{
			name: "init/key-does-not-match-cert",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				copyFile(t, pki(d, "konnectivity-server-client.key"), pki(d, "front-proxy-client.key"))
				return initIn(d), d
			},
			want: []string{"front-proxy-client", "does not match"},
		},
		{
			name: "certs-renew/key-does-not-match-cert",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				copyFile(t, pki(d, "konnectivity-server-client.key"), pki(d, "front-proxy-client.key"))
				return []string{"certs", "renew", "front-proxy-client", "--dir", d}, d
			},
			want: []string{"front-proxy-client", "match"},
		},
		{
			name: "init/expired-leaf",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				leaf := mustParseCert(t, pki(d, "konnectivity-server.crt"))
				signLeaf(t, pki(d, "konnectivity-server.crt"), leaf, leaf.PublicKey,
					mustParseCert(t, pki(d, "ca.crt")), mustParseKey(t, pki(d, "ca.key")),
					time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
				return initIn(d), d
			},
			want: []string{"konnectivity-server.crt", "expired"},
		},
		{
			name: "init/leaf-signed-by-another-ca",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				leaf := mustParseCert(t, pki(d, "konnectivity-server.crt"))
				ca := pkitest.NewCA(t, "someone-elses-ca")
				signLeaf(t, pki(d, "konnectivity-server.crt"), leaf, leaf.PublicKey, ca.Cert, ca.Key, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
				return initIn(d), d
			},
			want: []string{"konnectivity-server.crt", "not signed by"},
		},
		{
			name: "init/front-proxy-ca-equals-cluster-ca",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				copyFile(t, pki(d, "ca.crt"), pki(d, "front-proxy-ca.crt"))
				copyFile(t, pki(d, "ca.key"), pki(d, "front-proxy-ca.key"))
				return initIn(d), d
			},
			want:      []string{"distinct"},
			wantFiles: []string{"pki/front-proxy-ca.crt", "pki/ca.crt"},
		},
		{
			name: "certs-renew/front-proxy-ca-equals-cluster-ca",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				copyFile(t, pki(d, "ca.crt"), pki(d, "front-proxy-ca.crt"))
				copyFile(t, pki(d, "ca.key"), pki(d, "front-proxy-ca.key"))
				return []string{"certs", "renew", "all", "--dir", d}, d
			},
			want:      []string{"distinct"},
			wantFiles: []string{"pki/front-proxy-ca.crt", "pki/ca.crt"},
		},
		{
			name: "init/unparsable-address",
			setup: func(t *testing.T) ([]string, string) {
				d := filepath.Join(shortDir(t), "k")
				return initIn(d, "--control-plane-address", "not an address!"), filepath.Dir(d)
			},
			want: []string{"--control-plane-address", "not an address!"},
		},
		{
			name: "init/apiserver-url-port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := filepath.Join(shortDir(t), "k")
				return []string{"init", "--dir", d, "--control-plane-address", "127.0.0.1", "--apiserver-url", "https://127.0.0.1:99999"}, filepath.Dir(d)
			},
			want: []string{"--apiserver-url", "99999"},
			bug:  "konnect init accepts --apiserver-url https://127.0.0.1:99999 and writes it into konnectivity-server.conf",
		},
		{
			name: "init/frontend-port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := filepath.Join(shortDir(t), "k")
				return initIn(d, "--mode", "http-connect", "--transport", "tcp", "--frontend-port", "70000"), filepath.Dir(d)
			},
			want: []string{"--frontend-port", "70000"},
		},
		{
			name: "server/agent-port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				return serverArgs(d, filepath.Join(d, "s.sock"), serverPorts{agent: 70000, admin: harness.FreePort(t), health: harness.FreePort(t)}), d
			},
			want: []string{"--agent-port", "70000"},
		},
		{
			name: "agent/proxy-server-port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				return agentArgs(d, []int{70000}, harness.FreePort(t), harness.FreePort(t)), d
			},
			want: []string{"--proxy-server-port", "70000"},
		},
		{
			name: "agent/proxy-server-host-unspecified",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				return agentArgs(d, []int{harness.FreePort(t)}, harness.FreePort(t), harness.FreePort(t), "--proxy-server-host", "127.0.0.1,[::]:8132"), d
			},
			want: []string{"--proxy-server-host", ":: is the unspecified address"},
		},
		{
			name: "proxy/port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "kubeconfig"), testKubeconfig)
				return []string{"proxy", "--kubeconfig", filepath.Join(d, "kubeconfig"), "--port", "99999"}, d
			},
			want: []string{"--port", "99999"},
		},
		{
			name: "socks/port-out-of-range",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				return []string{"socks", "-F", "none", "--known-hosts", filepath.Join(d, "known_hosts"), "-D", "127.0.0.1:99999", "127.0.0.1"}, d
			},
			want: []string{"-D", "99999"},
		},
		{
			name: "init/conflict-grpc-over-tcp",
			setup: func(t *testing.T) ([]string, string) {
				d := filepath.Join(shortDir(t), "k")
				return initIn(d, "--mode", "grpc", "--transport", "tcp"), filepath.Dir(d)
			},
			// Both flags, each with the value that conflicts.
			want: []string{"--mode grpc", "--transport tcp"},
		},
		{
			name: "proxy/conflict-unix-socket-and-port",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "kubeconfig"), testKubeconfig)
				return []string{"proxy", "--kubeconfig", filepath.Join(d, "kubeconfig"), "--port", "0", "--unix-socket", filepath.Join(d, "p.sock")}, d
			},
			want: []string{"--unix-socket", "--port"},
		},
		{
			name: "init/dir-is-a-file",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "k"), "a file where a directory should be\n")
				return initIn(filepath.Join(d, "k")), d
			},
			want: []string{filepath.Join("k"), "not a directory"},
		},
		{
			name: "init/apiserver-manifest-not-a-pod",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "kube-apiserver.yaml"), "apiVersion: v1\nkind: Service\nmetadata:\n  name: kube-apiserver\n")
				return initIn(filepath.Join(d, "k"), "--apiserver-manifest", filepath.Join(d, "kube-apiserver.yaml")), d
			},
			want: []string{"kube-apiserver.yaml", "Pod"},
			bug:  "konnect init on a fresh --dir writes the whole PKI, kubeconfig and egress config before it rejects --apiserver-manifest",
		},
		{
			name: "init/apiserver-manifest-malformed-yaml",
			setup: func(t *testing.T) ([]string, string) {
				d := copyBase(t)
				writeFile(t, filepath.Join(d, "kube-apiserver.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: [\n  name: kube-apiserver\n")
				return initIn(d, "--apiserver-manifest", filepath.Join(d, "kube-apiserver.yaml")), d
			},
			want: []string{"kube-apiserver.yaml", "yaml"},
		},
		{
			name: "kubeconfig-set-proxy/context-missing",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "kubeconfig"), testKubeconfig)
				return []string{"kubeconfig", "set-proxy", "--kubeconfig", filepath.Join(d, "kubeconfig"), "--context", "nope", "--proxy-url", "socks5://127.0.0.1:1080"}, d
			},
			want: []string{"--context", `"nope"`},
		},
		{
			name: "proxy/context-missing",
			setup: func(t *testing.T) ([]string, string) {
				d := shortDir(t)
				writeFile(t, filepath.Join(d, "kubeconfig"), testKubeconfig)
				return []string{"proxy", "--kubeconfig", filepath.Join(d, "kubeconfig"), "--context", "nope", "--port", "0"}, d
			},
			want: []string{`"nope"`},
		},
	}
}

// TestBadInput gives the CLI bad input. Each gets a non-zero exit, an error naming the flag or file and
// the problem, and the directory it points at keeps every file, checksum and mode.
func TestBadInput(t *testing.T) {
	for _, tc := range badInputCases() {
		t.Run(tc.name, func(t *testing.T) {
			args, watch := tc.setup(t)
			before := snapshot(t, watch)
			r := konnect(t, time.Minute, args...)
			t.Logf("exit %d: %s", r.code, strings.TrimSpace(r.stderr))
			want := tc.want
			for _, f := range tc.wantFiles {
				want = append(want, filepath.Join(watch, f))
			}
			checkRefused(t, r, want, tc.bug)
			if d := diffSnapshots(before, snapshot(t, watch)); len(d) > 0 {
				t.Errorf("bad input changed %s:\n  %s%s", watch, strings.Join(d, "\n  "), bugNote(tc.bug))
			}
		})
	}
}

func bugNote(bug string) string {
	if bug == "" {
		return ""
	}
	return "\nknown product bug: " + bug
}

// checkRefused checks a refusal: non-zero exit, every wanted substring in stderr, and no flag named in the
// error that the command does not have.
func checkRefused(t *testing.T, r result, want []string, bug string) {
	t.Helper()
	if r.code == 0 {
		t.Errorf("accepted (exit 0), want a refusal naming %q%s\n%s", want, bugNote(bug), r)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("error does not name %q%s\n%s", w, bugNote(bug), r)
		}
	}
	checkFlagsExist(t, r)
}

// checkFlagsExist fails when an error tells the user to pass a flag the command does not have.
func checkFlagsExist(t *testing.T, r result) {
	t.Helper()
	var cmdPath []string
	for _, a := range r.args {
		if strings.HasPrefix(a, "-") {
			break
		}
		cmdPath = append(cmdPath, a)
	}
	if len(cmdPath) > 2 {
		cmdPath = cmdPath[:2]
	}
	help := konnect(t, time.Minute, append(cmdPath, "--help")...)
	// A command quoted in backticks (e.g. `konnect init --force`) may name another command's flags.
	msg := quotedCommand.ReplaceAllString(r.stderr, "")
	for _, m := range flagInError.FindAllStringSubmatch(msg, -1) {
		f := m[1]
		if !strings.Contains(help.stdout+help.stderr, f+" ") && !strings.Contains(help.stdout+help.stderr, f+"=") {
			t.Errorf("the error names %s, which `konnect %s` does not have:\n%s", f, strings.Join(cmdPath, " "), r.stderr)
		}
	}
}

func mount(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func umountAtCleanup(t *testing.T, dir string) {
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
}

// TestUnwritableDir runs konnect init against a directory it cannot write (a read-only bind mount:
// root ignores file modes) with one certificate to create. The error names the file, and nothing changes.
func TestUnwritableDir(t *testing.T) {
	requireRoot(t)
	d := copyBase(t)
	for _, f := range []string{"pki/konnectivity-server.crt", "pki/konnectivity-server.key"} {
		if err := os.Remove(filepath.Join(d, f)); err != nil {
			t.Fatal(err)
		}
	}
	mount(t, "--bind", d, d)
	umountAtCleanup(t, d)
	mount(t, "-o", "remount,bind,ro", d)
	before := snapshot(t, d)
	r := konnect(t, time.Minute, initArgs(d)...)
	t.Logf("exit %d: %s", r.code, strings.TrimSpace(r.stderr))
	checkRefused(t, r, []string{"konnectivity-server.key", "read-only file system"}, "")
	if diff := diffSnapshots(before, snapshot(t, d)); len(diff) > 0 {
		t.Errorf("changed: %v", diff)
	}
}

// TestFullDisk runs konnect init on a 64 KiB tmpfs: it runs out of space part way. It must fail with an
// error naming the file and the cause, leave no torn or temporary file, and complete once there is room.
func TestFullDisk(t *testing.T) {
	requireRoot(t)
	mnt := shortDir(t)
	mount(t, "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", mnt)
	umountAtCleanup(t, mnt)
	d := filepath.Join(mnt, "k")
	r := konnect(t, time.Minute, initArgs(d)...)
	checkRefused(t, r, []string{d, "no space left on device"}, "")
	st := inspectPKI(d)
	for _, p := range st.problems {
		t.Errorf("after ENOSPC: %s", p)
	}
	if len(st.temps) > 0 {
		t.Errorf("after ENOSPC: temporary files left: %v", st.temps)
	}
	err := filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
		if err == nil && tempFile.MatchString(e.Name()) {
			t.Errorf("after ENOSPC: temporary file left: %s", path)
		}
		if err == nil && e.Type().IsRegular() {
			if info, _ := e.Info(); info != nil && info.Size() == 0 {
				t.Errorf("after ENOSPC: empty file %s", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("at ENOSPC: %s", strings.TrimSpace(r.stderr))
	mount(t, "-o", "remount,size=16m", mnt)
	if r := konnect(t, time.Minute, initArgs(d)...); r.code != 0 {
		t.Fatalf("rerun with room: %s", r)
	}
	if st := inspectPKI(d); len(st.problems) > 0 {
		t.Errorf("after rerun: %v", st.problems)
	}
	if err := checkServerConf(d); err != nil {
		t.Error(err)
	}
}
