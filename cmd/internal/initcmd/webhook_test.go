package initcmd

import (
	"crypto/x509"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

const testWebhooks = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: pizzas
webhooks:
- name: validate.pizza.example.com
  clientConfig:
    service: {name: hook, namespace: pizza, path: /validate}
  admissionReviewVersions: ["v1"]
  sideEffects: None
- name: by-url.example.com
  clientConfig:
    url: https://hooks.example.com/validate
  admissionReviewVersions: ["v1"]
  sideEffects: None
`

// caBundleOf returns the number of CAs in the first webhook's caBundle in file.
func caBundleOf(t *testing.T, file string) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var vwc admissionv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(data, &vwc); err != nil {
		t.Fatal(err)
	}
	if len(vwc.Webhooks[1].ClientConfig.CABundle) != 0 {
		t.Fatal("the webhook reached by URL got a caBundle")
	}
	var cas []*x509.Certificate
	rest := vwc.Webhooks[0].ClientConfig.CABundle
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return cas
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, c)
	}
}

func TestCertsWebhookAndRotateCA(t *testing.T) {
	in := t.TempDir()
	// .yml: rotate-ca must find a manifest by kustomization.yaml, not by its extension.
	hooks := filepath.Join(in, "hooks.yml")
	if err := os.WriteFile(hooks, []byte(testWebhooks), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "hook")
	args := []string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", out, "--key-algorithm", "ecdsa-p256", hooks}
	stdout := mustRun(t, args...)
	if !strings.Contains(stdout, "ValidatingWebhookConfiguration pizzas/validate.pizza.example.com") {
		t.Fatalf("output does not name the patched webhook:\n%s", stdout)
	}
	for _, f := range []string{"pki/ca.crt", "pki/ca.key", "pki/tls.crt", "pki/tls.key", "secret.yaml", "hooks.yml", "kustomization.yaml"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(caBundleOf(t, filepath.Join(out, "hooks.yml"))); n != 1 {
		t.Fatalf("caBundle holds %d CAs", n)
	}
	before := sums(t, out)
	mustRun(t, args...)
	if after := sums(t, out); !maps.Equal(before, after) {
		t.Fatal("a second identical run changed files")
	}
	if orig, _ := os.ReadFile(hooks); string(orig) != testWebhooks {
		t.Fatal("the input manifest was modified")
	}

	// Bad input names the flag or file and writes nothing.
	for name, bad := range map[string]struct {
		args []string
		want string
	}{
		"missing manifest": {[]string{filepath.Join(in, "nope.yaml")}, "nope.yaml"},
		"no match":         {[]string{"--service", "other", hooks}, "Service pizza/other"},
		"same file name":   {[]string{hooks, hooks}, "same file name"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "x")
			a := append([]string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", dir}, bad.args...)
			if _, err := run(t, a...); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("err %v, want %q", err, bad.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("%s was written: %v", dir, err)
			}
		})
	}

	// Rotation: out of order is refused; each step says what comes next.
	rotate := func(step string) (string, error) { return run(t, "certs", "rotate-ca", "--out", out, "--step", step) }
	if _, err := rotate("2"); err == nil || !strings.Contains(err.Error(), "--step 2") || !strings.Contains(err.Error(), "next step is 1") {
		t.Fatalf("step 2 first: %v", err)
	}
	for _, tc := range []struct {
		step, next string
		cas        int
	}{{"1", "--step 2", 2}, {"2", "--step 3", 2}, {"3", "rotation is complete", 1}} {
		stdout, err := rotate(tc.step)
		if err != nil || !strings.Contains(stdout, "Step "+tc.step+" written") || !strings.Contains(stdout, tc.next) || !strings.Contains(stdout, "kubectl apply -k "+out) {
			t.Fatalf("step %s: %v\n%s", tc.step, err, stdout)
		}
		if n := len(caBundleOf(t, filepath.Join(out, "hooks.yml"))); n != tc.cas {
			t.Fatalf("after step %s the caBundle holds %d CAs, want %d", tc.step, n, tc.cas)
		}
	}
	if _, err := run(t, "certs", "rotate-ca", "--out", t.TempDir(), "--step", "1"); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Fatalf("rotate-ca in an empty directory: %v", err)
	}
}

// rotate-ca works on a `certs apiservice` directory too: the APIService's caBundle follows the steps.
func TestRotateCAAPIService(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "api")
	mustRun(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", dir, "--key-algorithm", "ecdsa-p256")
	countCAs := func() int {
		data, err := os.ReadFile(filepath.Join(dir, "apiservice.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Spec struct {
				CABundle []byte `json:"caBundle"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(obj.Spec.CABundle), "BEGIN CERTIFICATE")
	}
	mustRun(t, "certs", "rotate-ca", "--out", dir, "--step", "1")
	if n := countCAs(); n != 2 {
		t.Fatalf("after step 1: %d CAs", n)
	}
	// certs apiservice in the middle of a rotation keeps the bundle of two.
	mustRun(t, "certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", dir)
	if n := countCAs(); n != 2 {
		t.Fatalf("certs apiservice during the rotation: %d CAs", n)
	}
}

// TestServingDirSharedByAPIServiceAndWebhook: an aggregated API server that also serves a webhook has one
// directory for both commands. Its kustomization.yaml lists what each wrote, a rerun drops nothing, and
// rotate-ca reaches the webhook's caBundle too. A kustomization.yaml with more than konnect writes is
// someone else's: it is refused, and nothing is written.
func TestServingDirSharedByAPIServiceAndWebhook(t *testing.T) {
	in := t.TempDir()
	hooks := filepath.Join(in, "hooks.yaml")
	if err := os.WriteFile(hooks, []byte(strings.ReplaceAll(testWebhooks, "name: hook", "name: api")), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "api")
	apiservice := []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1", "--out", dir}
	mustRun(t, apiservice...)
	mustRun(t, "certs", "webhook", "--service", "api", "--namespace", "pizza", "--out", dir, hooks)
	resources := func() []string {
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k struct{ Resources []string }
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Fatal(err)
		}
		return k.Resources
	}
	listed := resources()
	for _, f := range []string{"secret.yaml", "apiservice.yaml", "hooks.yaml"} {
		if !slices.Contains(listed, f) {
			t.Fatalf("kustomization.yaml lists %v, without %s", listed, f)
		}
	}
	before := sums(t, dir)
	mustRun(t, apiservice...)
	if !maps.Equal(before, sums(t, dir)) {
		t.Fatalf("certs apiservice again changed the directory; kustomization.yaml lists %v", resources())
	}
	mustRun(t, "certs", "rotate-ca", "--out", dir, "--step", "1")
	if n := len(caBundleOf(t, filepath.Join(dir, "hooks.yaml"))); n != 2 {
		t.Fatalf("the webhook's caBundle after step 1 holds %d CAs", n)
	}

	other := filepath.Join(t.TempDir(), "app")
	os.MkdirAll(other, 0o755)
	mine := "resources:\n- deployment.yaml\nnamespace: pizza\n"
	os.WriteFile(filepath.Join(other, "kustomization.yaml"), []byte(mine), 0o644)
	_, err := run(t, "certs", "webhook", "--service", "api", "--namespace", "pizza", "--out", other, hooks)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(other, "kustomization.yaml")) || !strings.Contains(err.Error(), `field "namespace"`) {
		t.Fatalf("a user's kustomization.yaml: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(other, "kustomization.yaml")); string(data) != mine {
		t.Fatalf("the user's kustomization.yaml became:\n%s", data)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 1 {
		t.Fatalf("the refused run wrote %v", entries)
	}
}

// TestServingDirNamesDoNotCollide: in a directory that certs apiservice and certs webhook share, a webhook
// manifest named like one of the APIService's files is refused before anything is written, and a copy an
// older konnect wrote under such a name is not replaced by certs apiservice: either would leave one of the
// two out of the directory, and out of the next rotate-ca.
func TestServingDirNamesDoNotCollide(t *testing.T) {
	in := t.TempDir()
	hooks := strings.ReplaceAll(testWebhooks, "name: hook", "name: api")
	apiservice := []string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "restaurant.example.com", "--version", "v1alpha1"}
	for _, name := range []string{"apiservice.yaml", "auth-delegator.yaml", "authentication-reader.yaml"} {
		t.Run(name, func(t *testing.T) {
			input := filepath.Join(in, name)
			if err := os.WriteFile(input, []byte(hooks), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "api")
			mustRun(t, append(apiservice, "--out", dir)...)
			before := sums(t, dir)
			_, err := run(t, "certs", "webhook", "--service", "api", "--namespace", "pizza", "--out", dir, input)
			if err == nil || !strings.Contains(err.Error(), input) || !strings.Contains(err.Error(), "rename it") {
				t.Fatalf("a webhook manifest named %s: %v", name, err)
			}
			if !maps.Equal(before, sums(t, dir)) {
				t.Fatal("the refused certs webhook changed the directory")
			}

			// As an older konnect left it: the webhook's copy in the APIService's file.
			dir = filepath.Join(t.TempDir(), "api")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			copied := filepath.Join(dir, name)
			if err := os.WriteFile(copied, markedCopy([]byte(hooks)), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = run(t, append(apiservice, "--out", dir)...)
			if err == nil || !strings.Contains(err.Error(), copied) {
				t.Fatalf("certs apiservice over a webhook copy in %s: %v", name, err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("the refused certs apiservice wrote %v", entries)
			}
		})
	}
}
