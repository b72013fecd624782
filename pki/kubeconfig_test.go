package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"k8s.io/client-go/tools/clientcmd"
)

func TestKubeconfig(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	const url = "https://198.18.0.1:6443"
	r, err := EnsureKubeconfig(cfg, url)
	if err != nil || r.Action != Created {
		t.Fatalf("%+v %v", r, err)
	}
	path := cfg.KubeconfigPath()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != KeyMode {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	// Load it the way the Konnectivity server does.
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != url {
		t.Errorf("host %q", rc.Host)
	}
	pair, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if leaf.Subject.CommonName != "system:konnectivity-server" || len(leaf.Subject.Organization) != 0 {
		t.Errorf("client subject %v", leaf.Subject)
	}
	caPEM, _ := os.ReadFile(specByName(t, CA).CertFile(cfg.PKIDir()))
	if string(rc.CAData) != string(caPEM) {
		t.Error("CA data is not ca.crt")
	}
	kc, _ := clientcmd.LoadFromFile(path)
	if kc.CurrentContext != "system:konnectivity-server@kubernetes" {
		t.Errorf("context %q", kc.CurrentContext)
	}

	// A killed write's temporary file holds the key too: the next run removes it.
	stale := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-1234")
	if err := os.WriteFile(stale, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureKubeconfig(cfg, url); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary file %s is still there: %v", stale, err)
	}
	before := snapshot(t, cfg.Dir)
	if r, err := EnsureKubeconfig(cfg, url); err != nil || r.Action != Kept {
		t.Fatalf("second run %+v %v", r, err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}

	var fe *field.Error
	if _, err := EnsureKubeconfig(cfg, "https://198.18.0.9:6443"); err == nil || !strings.Contains(err.Error(), path) || !errors.As(err, &fe) || !slices.Equal(fe.Fields(), []string{"Force"}) {
		t.Fatalf("other URL: %v", err)
	}
	forced := cfg
	forced.Force = true
	if r, err := EnsureKubeconfig(forced, "https://198.18.0.9:6443"); err != nil || r.Action != Updated || !r.Forced || r.Reason != "rewritten" {
		t.Fatalf("forced %+v %v", r, err)
	}

	// A new client certificate reaches the kubeconfig without --force.
	client := specByName(t, KonnectivityServerClient)
	os.Remove(client.CertFile(cfg.PKIDir()))
	os.Remove(client.KeyFile(cfg.PKIDir()))
	mustEnsure(t, cfg)
	if r, err := EnsureKubeconfig(cfg, "https://198.18.0.9:6443"); err != nil || r.Action != Updated {
		t.Fatalf("after new client cert %+v %v", r, err)
	}
	rc, _ = clientcmd.BuildConfigFromFlags("", path)
	certPEM, _ := os.ReadFile(client.CertFile(cfg.PKIDir()))
	if string(rc.CertData) != string(certPEM) {
		t.Fatal("kubeconfig still embeds the old client certificate")
	}
}

// A kubeconfig whose content is as it should be but which others may read (copied with cp, or written by
// hand) holds the client key all the same: a run closes it and says so, and does not keep it as it was.
func TestKubeconfigReadableByOthers(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	const url = "https://198.18.0.1:6443"
	if _, err := EnsureKubeconfig(cfg, url); err != nil {
		t.Fatal(err)
	}
	path := cfg.KubeconfigPath()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	dry := cfg
	dry.DryRun = true
	if r, err := EnsureKubeconfig(dry, url); err != nil || r.Action != Updated || !r.DryRun || !strings.Contains(r.Reason, "0644") {
		t.Fatalf("dry run %+v %v", r, err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Fatalf("the dry run changed the mode to %04o", st.Mode().Perm())
	}
	r, err := EnsureKubeconfig(cfg, url)
	if err != nil || r.Action != Updated || !strings.Contains(r.Reason, "0644") || !strings.Contains(r.Reason, "private key") {
		t.Fatalf("%+v %v", r, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != KeyMode {
		t.Fatalf("mode %v %v, want %04o", st.Mode(), err, KeyMode)
	}
	if r, err := EnsureKubeconfig(cfg, url); err != nil || r.Action != Kept {
		t.Fatalf("next run %+v %v", r, err)
	}
}

func TestKubeconfigBadInputs(t *testing.T) {
	cfg := testConfig(t)
	for _, u := range []string{"http://198.18.0.1:6443", "198.18.0.1:6443", "https://", "https://u:p@h:6443"} {
		if _, err := EnsureKubeconfig(cfg, u); err == nil || !strings.Contains(err.Error(), u) {
			t.Errorf("%q: %v", u, err)
		}
	}
	// No certificates yet: the error names the missing file.
	_, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443")
	if err == nil || !strings.Contains(err.Error(), specByName(t, CA).CertFile(cfg.PKIDir())) {
		t.Fatalf("no certificates: %v", err)
	}
	if _, err := os.Stat(cfg.KubeconfigPath()); !os.IsNotExist(err) {
		t.Fatal("kubeconfig written")
	}
}

func TestRenew(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	if _, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	dir := cfg.PKIDir()
	before := snapshot(t, cfg.Dir)
	old := map[string]*x509.Certificate{}
	for _, s := range Specs() {
		old[s.Name] = loadCert(t, s.CertFile(dir))
	}
	later := time.Now().Add(30 * 24 * time.Hour)
	cfg.Now = func() time.Time { return later }
	cfg.ControlPlaneAddresses = nil // renew keeps the certificate's SANs, not the inputs'
	res, err := Renew(cfg, All)
	if err != nil {
		t.Fatal(err)
	}
	changed := map[string]bool{}
	for _, p := range diffSnapshots(before, snapshot(t, cfg.Dir)) {
		changed[p] = true
	}
	for _, s := range Specs() {
		if changed[s.KeyFile(dir)] {
			t.Errorf("%s: key rewritten", s.Name)
		}
		if s.IsCA {
			if changed[s.CertFile(dir)] {
				t.Errorf("CA %s renewed by all", s.Name)
			}
			continue
		}
		if r := resultByName(t, res, s.Name); r.Action != Renewed {
			t.Errorf("%+v", r)
		}
		n := loadCert(t, s.CertFile(dir))
		o := old[s.Name]
		if !n.NotAfter.After(o.NotAfter) || n.Subject.String() != o.Subject.String() ||
			strings.Join(n.DNSNames, ",") != strings.Join(o.DNSNames, ",") || len(n.IPAddresses) != len(o.IPAddresses) {
			t.Errorf("%s: renewed %v %v %v, was %v %v %v", s.Name, n.NotAfter, n.DNSNames, n.IPAddresses, o.NotAfter, o.DNSNames, o.IPAddresses)
		}
	}
	if r := resultByName(t, res, "kubeconfig"); r.Action != Updated {
		t.Errorf("kubeconfig %+v", r)
	}
	cfg.ControlPlaneAddresses = []string{"198.18.0.1", "cp.example.test"}
	for _, r := range mustEnsure(t, cfg) {
		if r.Action != Kept {
			t.Errorf("after renew, %s %s", r.Name, r.Action)
		}
	}

	// Renewing the CA keeps it valid for everything it signed, and the kubeconfig, which embeds it, follows.
	res, err = Renew(cfg, CA)
	if err != nil || len(res) != 2 || res[0].Name != CA || res[1].Name != "kubeconfig" || res[1].Action != Updated {
		t.Fatalf("%v %v", res, err)
	}
	caPEM, _ := os.ReadFile(specByName(t, CA).CertFile(dir))
	if rc, err := clientcmd.BuildConfigFromFlags("", cfg.KubeconfigPath()); err != nil || string(rc.CAData) != string(caPEM) {
		t.Fatalf("kubeconfig does not embed the renewed ca.crt (%v)", err)
	}
	ca := loadCert(t, specByName(t, CA).CertFile(dir))
	if !ca.NotAfter.After(old[CA].NotAfter) || ca.Subject.String() != old[CA].Subject.String() {
		t.Fatalf("renewed CA %v %v", ca.NotAfter, ca.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	leaf := loadCert(t, specByName(t, KonnectivityServer).CertFile(dir))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: later}); err != nil {
		t.Fatalf("leaf no longer verifies against the renewed CA: %v", err)
	}
	for _, r := range mustEnsure(t, cfg) {
		if r.Action != Kept {
			t.Errorf("after CA renew, %s %s", r.Name, r.Action)
		}
	}

	// A dry run reports the kubeconfig it would update, with the client certificate's new expiry, and
	// writes nothing.
	before = snapshot(t, cfg.Dir)
	dry := cfg
	dry.DryRun = true
	dry.Now = func() time.Time { return later.Add(24 * time.Hour) }
	res, err = Renew(dry, KonnectivityServerClient)
	if err != nil || len(res) != 2 || res[1].Name != "kubeconfig" || res[1].Action != Updated || !res[1].DryRun ||
		!res[1].NotAfter.Equal(res[0].NotAfter) {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) != 0 {
		t.Fatalf("dry run wrote %v", changed)
	}
}

func TestRenewErrors(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	for _, tc := range []struct {
		names []string
		prep  func()
		want  string
	}{
		{nil, func() {}, "name a certificate"},
		{[]string{"apiserver"}, func() {}, `unknown certificate "apiserver"`},
		{[]string{KonnectivityAgent}, func() {
			copyFile(t, specByName(t, KonnectivityServer).KeyFile(dir), specByName(t, KonnectivityAgent).KeyFile(dir))
		}, specByName(t, KonnectivityAgent).KeyFile(dir) + " does not match"},
		{[]string{KonnectivityServer}, func() { os.Remove(specByName(t, CA).KeyFile(dir)) }, "ca.key is missing"},
		{[]string{CA}, func() {}, "is external"},
	} {
		tc.prep()
		before := snapshot(t, cfg.Dir)
		if _, err := Renew(cfg, tc.names...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Renew(%v): %v, want %q", tc.names, err, tc.want)
		}
		if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
			t.Errorf("Renew(%v) changed %v", tc.names, changed)
		}
	}
}

// TestRenewUnderExpiredCA: a leaf is never re-signed to outlive its CA, so under an expired CA it would be
// expired at once; renew refuses that, writing nothing, unless the CA is renewed in the same run. Under a CA
// that expires sooner than the leaf's lifetime, the leaf is renewed and the result says it was cut short.
func TestRenewUnderExpiredCA(t *testing.T) {
	cfg := testConfig(t)
	cfg.CAValidity, cfg.CertValidity = 2*time.Hour, time.Hour
	mustEnsure(t, cfg)
	cfg.CAValidity, cfg.CertValidity = DefaultCAValidity, DefaultCertValidity
	dir := cfg.PKIDir()

	cut, err := Renew(cfg, FrontProxyClient)
	if err != nil {
		t.Fatal(err)
	}
	if r := resultByName(t, cut, FrontProxyClient); r.Reason != "validity cut to the CA's expiry" {
		t.Errorf("renewed under a CA that expires first: %+v", r)
	}

	cfg.Now = func() time.Time { return time.Now().Add(3 * time.Hour) }
	before := snapshot(t, cfg.Dir)
	_, err = Renew(cfg, All)
	if err == nil || !strings.Contains(err.Error(), specByName(t, FrontProxyCA).CertFile(dir)+" expired on") ||
		!strings.Contains(err.Error(), "konnect certs renew "+FrontProxyCA+" first") {
		t.Fatalf("Renew(all) under expired CAs = %v", err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("Renew changed %v", changed)
	}
	res, err := Renew(cfg, FrontProxyCA, FrontProxyClient)
	if err != nil {
		t.Fatal(err)
	}
	if r := resultByName(t, res, FrontProxyClient); r.Reason != "" || !r.NotAfter.After(cfg.Now().Add(DefaultCertValidity-time.Hour)) {
		t.Errorf("renewed with its CA: %+v", r)
	}
}

// TestRenewRefusesFrontProxyCAEqualToClusterCA: renew refuses the CA reuse that init refuses, and writes nothing.
func TestRenewRefusesFrontProxyCAEqualToClusterCA(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	copyFile(t, specByName(t, CA).CertFile(dir), specByName(t, FrontProxyCA).CertFile(dir))
	copyFile(t, specByName(t, CA).KeyFile(dir), specByName(t, FrontProxyCA).KeyFile(dir))
	before := snapshot(t, cfg.Dir)
	if _, err := Renew(cfg, All); err == nil || !strings.Contains(err.Error(), "must be distinct") {
		t.Fatalf("Renew(all) = %v, want the CA-reuse refusal", err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("Renew changed %v", changed)
	}
}

func TestCheckExpiration(t *testing.T) {
	cfg := testConfig(t)
	cfg.AgentMTLS, cfg.FrontendTLS = false, false
	mustEnsure(t, cfg)
	if _, err := EnsureKubeconfig(cfg, "https://198.18.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	os.Remove(specByName(t, FrontProxyCA).KeyFile(cfg.PKIDir()))
	now := time.Now()
	cfg.Now = func() time.Time { return now }
	exp, err := CheckExpiration(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ ca, external bool }{
		CA: {true, false}, FrontProxyCA: {true, true}, FrontProxyClient: {false, true},
		KonnectivityServerClient: {false, false}, KonnectivityServer: {false, false}, KubeconfigFile: {false, false},
	}
	if len(exp) != len(want) {
		t.Fatalf("%d entries: %+v", len(exp), exp)
	}
	for _, e := range exp {
		w, ok := want[e.Name]
		if !ok || e.CA != w.ca || e.External != w.external {
			t.Errorf("%+v, want %+v", e, w)
		}
		wantResidual := map[bool]string{true: "9y", false: "364d"}[e.CA]
		if e.Residual != wantResidual || e.ResidualSeconds <= 0 || e.File == "" {
			t.Errorf("%s: residual %q %d", e.Name, e.Residual, e.ResidualSeconds)
		}
	}
	data, _ := json.Marshal(exp)
	if strings.Contains(string(data), "PRIVATE KEY") || strings.Contains(string(data), "BEGIN") {
		t.Fatal("key material in JSON")
	}
	later := now.Add(2 * DefaultCertValidity)
	cfg.Now = func() time.Time { return later }
	exp, _ = CheckExpiration(cfg)
	for _, e := range exp {
		if !e.CA && (e.Residual != "expired" || e.ResidualSeconds >= 0) {
			t.Errorf("%s: %q %d a year past expiry", e.Name, e.Residual, e.ResidualSeconds)
		}
	}
	os.WriteFile(specByName(t, KonnectivityServer).CertFile(cfg.PKIDir()), []byte("junk"), 0o644)
	if _, err := CheckExpiration(cfg); err == nil || !strings.Contains(err.Error(), "konnectivity-server.crt") {
		t.Fatalf("corrupt file: %v", err)
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Hour: "expired", 0: "expired", 30 * time.Minute: "30m", 5 * time.Hour: "5h",
		3 * 24 * time.Hour: "3d", 400 * 24 * time.Hour: "1y",
	} {
		if got := HumanDuration(d); got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}

func TestAPIService(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), KeyAlgorithm: ECDSAP256}
	res, b, err := EnsureServing(cfg, "api", "pizza-apiserver")
	if err != nil || len(res) != 2 {
		t.Fatalf("%v %v", res, err)
	}
	pair, err := tls.X509KeyPair(b.Cert, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if leaf.Subject.CommonName != "api.pizza-apiserver.svc" ||
		strings.Join(leaf.DNSNames, ",") != "api.pizza-apiserver.svc,api.pizza-apiserver.svc.cluster.local" {
		t.Fatalf("%v %v", leaf.Subject, leaf.DNSNames)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.CA) {
		t.Fatal("caBundle")
	}
	// What the aggregator checks: the service DNS name against the caBundle.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "api.pizza-apiserver.svc"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key", "tls.crt", "tls.key"} {
		if _, err := os.Stat(cfg.Dir + "/" + f); err != nil {
			t.Error(err)
		}
	}
	before := snapshot(t, cfg.Dir)
	if _, b2, err := EnsureServing(cfg, "api", "pizza-apiserver"); err != nil || string(b2.CA) != string(b.CA) {
		t.Fatal(err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}
	// Another service name does not match the existing serving certificate.
	if _, _, err := EnsureServing(cfg, "other", "pizza-apiserver"); err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Fatalf("other service: %v", err)
	}
	for _, bad := range [][2]string{{"Bad_Name", "ns"}, {"api", "Bad.NS"}} {
		if _, _, err := EnsureServing(cfg, bad[0], bad[1]); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
