package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSpecsAreFreshValues(t *testing.T) {
	a := Specs()
	a[0].CommonName = "changed"
	a[2].Usages[0] = x509.ExtKeyUsageAny
	b := Specs()
	if b[0].CommonName != "kubernetes-ca" || b[2].Usages[0] != x509.ExtKeyUsageClientAuth {
		t.Fatal("Specs shares values between calls")
	}
	if err := checkTable(b); err != nil {
		t.Fatal(err)
	}
}

func TestCheckTableRejectsBadTables(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func([]*Spec) []*Spec
		wants string
	}{
		{"unknown CA", func(s []*Spec) []*Spec { s[2].CA = "nope"; return s }, `names CA "nope"`},
		{"leaf before CA", func(s []*Spec) []*Spec { return append([]*Spec{s[2]}, s...) }, "not a CA listed before it"},
		{"duplicate", func(s []*Spec) []*Spec { return append(s, s[0]) }, "appears twice"},
		{"CA with issuer", func(s []*Spec) []*Spec { s[1].CA = CA; return s }, "self-signed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkTable(tc.edit(Specs()))
			if err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("checkTable: %v, want %q", err, tc.wants)
			}
		})
	}
}

// TestEnsureSpecs checks every certificate of the table against what it must be.
func TestEnsureSpecs(t *testing.T) {
	cfg := testConfig(t)
	cfg.KeyAlgorithm = RSA2048 // the default
	res := mustEnsure(t, cfg)
	if len(res) != len(Specs()) {
		t.Fatalf("got %d results, want %d", len(res), len(Specs()))
	}
	dir := cfg.PKIDir()
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("pki dir: %v %v, want mode 0700", st.Mode(), err)
	}
	server := []string{"198.18.0.1", "cp.example.test", "node-1", "localhost", "127.0.0.1"}
	frontend := []string{"198.18.0.1", "cp.example.test", "localhost", "127.0.0.1"}
	for _, tc := range []struct {
		name   string
		cn     string
		issuer string
		ca     bool
		usages []x509.ExtKeyUsage
		sans   []string
	}{
		{CA, "kubernetes-ca", "kubernetes-ca", true, nil, nil},
		{FrontProxyCA, "front-proxy-ca", "front-proxy-ca", true, nil, nil},
		{FrontProxyClient, "front-proxy-client", "front-proxy-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil},
		{KonnectivityServerClient, "system:konnectivity-server", "kubernetes-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil},
		{KonnectivityServer, "konnectivity-server", "kubernetes-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, server},
		{KonnectivityAgentCA, "konnectivity-agent-ca", "konnectivity-agent-ca", true, nil, nil},
		{KonnectivityAgent, "konnectivity-agent", "konnectivity-agent-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil},
		{KonnectivityFrontend, "konnectivity-frontend", "kubernetes-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, frontend},
		{APIServerEgressClient, "apiserver-egress-client", "kubernetes-ca", false, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := specByName(t, tc.name)
			r := resultByName(t, res, tc.name)
			if r.Action != Created || r.CertFile != s.CertFile(dir) || r.KeyFile != s.KeyFile(dir) {
				t.Errorf("result %+v", r)
			}
			cert := loadCert(t, s.CertFile(dir))
			key, _, err := readKey(s.KeyFile(dir))
			if err != nil {
				t.Fatal(err)
			}
			if !samePublicKey(cert.PublicKey, key.Public()) {
				t.Error("key does not match certificate")
			}
			if k, ok := key.(*rsa.PrivateKey); !ok || k.N.BitLen() != 2048 {
				t.Errorf("key %T, want RSA 2048", key)
			}
			for file, mode := range map[string]os.FileMode{s.CertFile(dir): 0o644, s.KeyFile(dir): 0o600} {
				if st, err := os.Stat(file); err != nil || st.Mode().Perm() != mode {
					t.Errorf("%s: mode %v (%v), want %v", file, st.Mode().Perm(), err, mode)
				}
			}
			if cert.Subject.CommonName != tc.cn || cert.Issuer.CommonName != tc.issuer {
				t.Errorf("subject %q issuer %q, want %q %q", cert.Subject, cert.Issuer, tc.cn, tc.issuer)
			}
			if len(cert.Subject.Organization) != 0 {
				t.Errorf("O = %q, want none (never system:masters)", cert.Subject.Organization)
			}
			if cert.IsCA != tc.ca || !cert.BasicConstraintsValid {
				t.Errorf("IsCA = %v, want %v", cert.IsCA, tc.ca)
			}
			if !slices.Equal(cert.ExtKeyUsage, tc.usages) {
				t.Errorf("ExtKeyUsage %v, want %v", cert.ExtKeyUsage, tc.usages)
			}
			var sans []string
			sans = append(sans, cert.DNSNames...)
			for _, ip := range cert.IPAddresses {
				sans = append(sans, ip.String())
			}
			slices.Sort(sans)
			want := slices.Clone(tc.sans)
			slices.Sort(want)
			if !slices.Equal(sans, want) {
				t.Errorf("SANs %v, want %v", sans, want)
			}
			validity := cert.NotAfter.Sub(cert.NotBefore) - clockSkew
			if tc.ca {
				if cert.KeyUsage&x509.KeyUsageCertSign == 0 || validity != DefaultCAValidity {
					t.Errorf("CA key usage %v validity %v", cert.KeyUsage, validity)
				}
				return
			}
			if validity != DefaultCertValidity {
				t.Errorf("validity %v, want %v", validity, DefaultCertValidity)
			}
			if cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
				t.Errorf("key usage %v lacks digitalSignature", cert.KeyUsage)
			}
			// The same verification `openssl verify -CAfile` does, with the purpose checked too.
			issuer := loadCert(t, specByName(t, s.CA).CertFile(dir))
			roots := x509.NewCertPool()
			roots.AddCert(issuer)
			opts := x509.VerifyOptions{Roots: roots, KeyUsages: tc.usages}
			if len(tc.sans) > 0 {
				opts.DNSName = "cp.example.test"
			}
			if _, err := cert.Verify(opts); err != nil {
				t.Errorf("verify against %s: %v", s.CA, err)
			}
			for _, other := range []string{CA, FrontProxyCA} {
				if other == s.CA {
					continue
				}
				pool := x509.NewCertPool()
				pool.AddCert(loadCert(t, specByName(t, other).CertFile(dir)))
				if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
					t.Errorf("also verifies against %s", other)
				}
			}
		})
	}
}

func TestEnsureOptionalSpecs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		agent    bool
		frontend bool
		want     []string
	}{
		{"token agents, UDS", false, false, []string{CA, FrontProxyCA, FrontProxyClient, KonnectivityServerClient, KonnectivityServer}},
		{"mTLS agents", true, false, []string{CA, FrontProxyCA, KonnectivityAgentCA, FrontProxyClient, KonnectivityServerClient, KonnectivityServer, KonnectivityAgent}},
		{"HTTPConnect over TCP", false, true, []string{CA, FrontProxyCA, FrontProxyClient, KonnectivityServerClient, KonnectivityServer, KonnectivityFrontend, APIServerEgressClient}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.AgentMTLS, cfg.FrontendTLS = tc.agent, tc.frontend
			var got []string
			for _, r := range mustEnsure(t, cfg) {
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			entries, _ := os.ReadDir(cfg.PKIDir())
			if len(entries) != 2*len(tc.want) {
				t.Fatalf("%d files in %s, want %d", len(entries), cfg.PKIDir(), 2*len(tc.want))
			}
		})
	}
}

func TestEnsureKeyAlgorithms(t *testing.T) {
	for _, alg := range KeyAlgorithms() {
		t.Run(string(alg), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.KeyAlgorithm = alg
			mustEnsure(t, cfg, KonnectivityServer)
			for _, name := range []string{CA, KonnectivityServer} {
				s := specByName(t, name)
				key, _, err := readKey(s.KeyFile(cfg.PKIDir()))
				if err != nil {
					t.Fatal(err)
				}
				got, err := keyAlgorithmOf(key.Public())
				if err != nil || got != alg {
					t.Fatalf("%s: key algorithm %v (%v), want %v", name, got, err, alg)
				}
				cert := loadCert(t, s.CertFile(cfg.PKIDir()))
				_, isRSA := key.(*rsa.PrivateKey)
				_, isEC := key.(*ecdsa.PrivateKey)
				if isEC && cert.KeyUsage&x509.KeyUsageKeyEncipherment != 0 {
					t.Errorf("%s: ECDSA certificate with keyEncipherment", name)
				}
				if isRSA && !s.IsCA && cert.KeyUsage&x509.KeyUsageKeyEncipherment == 0 {
					t.Errorf("%s: RSA serving certificate without keyEncipherment", name)
				}
			}
		})
	}
	// The flag value is case-insensitive; keys are still generated.
	cfg := testConfig(t)
	cfg.KeyAlgorithm = "ECDSA-P256"
	mustEnsure(t, cfg, CA)
	if _, err := ParseKeyAlgorithm("dsa-1024"); err == nil || !strings.Contains(err.Error(), "rsa-2048") {
		t.Fatalf("ParseKeyAlgorithm(dsa-1024) = %v", err)
	}
}

func TestEnsureValidity(t *testing.T) {
	cfg := testConfig(t)
	cfg.CAValidity = 48 * time.Hour
	cfg.CertValidity = 24 * time.Hour
	mustEnsure(t, cfg, KonnectivityServer)
	ca := loadCert(t, specByName(t, CA).CertFile(cfg.PKIDir()))
	leaf := loadCert(t, specByName(t, KonnectivityServer).CertFile(cfg.PKIDir()))
	if d := ca.NotAfter.Sub(ca.NotBefore) - clockSkew; d != 48*time.Hour {
		t.Errorf("CA validity %v", d)
	}
	if d := leaf.NotAfter.Sub(leaf.NotBefore) - clockSkew; d != 24*time.Hour {
		t.Errorf("leaf validity %v", d)
	}
	cfg.CertValidity = 72 * time.Hour
	if _, err := Ensure(cfg); err == nil || !strings.Contains(err.Error(), "exceeds CA validity") {
		t.Fatalf("leaf longer than CA: %v", err)
	}
}

func TestEnsureIsIdempotent(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	before := snapshot(t, cfg.Dir)
	res := mustEnsure(t, cfg)
	for _, r := range res {
		if r.Action != Kept {
			t.Errorf("second run: %s %s", r.Name, r.Action)
		}
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("second run changed %v", changed)
	}
}

func TestEnsureRegeneratesOnlyDeletedLeaf(t *testing.T) {
	for _, files := range []string{"both", "crt", "key"} {
		t.Run(files, func(t *testing.T) {
			cfg := testConfig(t)
			mustEnsure(t, cfg)
			s := specByName(t, KonnectivityServer)
			dir := cfg.PKIDir()
			before := snapshot(t, cfg.Dir)
			if files != "key" {
				os.Remove(s.CertFile(dir))
			}
			if files != "crt" {
				os.Remove(s.KeyFile(dir))
			}
			cfg.Force = files == "key" // a certificate without its key is repaired only on request
			if files == "key" {
				c := cfg
				c.Force = false
				if _, err := Ensure(c); err == nil || !strings.Contains(err.Error(), s.KeyFile(dir)+" is missing") {
					t.Fatalf("certificate without key: %v", err)
				}
			}
			res := mustEnsure(t, cfg)
			changed := diffSnapshots(before, snapshot(t, cfg.Dir))
			slices.Sort(changed)
			want := []string{s.CertFile(dir), s.KeyFile(dir)}
			if !slices.Equal(changed, want) {
				t.Fatalf("changed %v, want %v", changed, want)
			}
			for _, r := range res {
				wantAction := Kept
				if r.Name == KonnectivityServer {
					wantAction = map[string]Action{"both": Created, "crt": Created, "key": Renewed}[files]
				}
				if r.Action != wantAction {
					t.Errorf("%s: %s, want %s", r.Name, r.Action, wantAction)
				}
			}
			if files == "crt" && !strings.Contains(resultByName(t, res, KonnectivityServer).Reason, "without a certificate") {
				t.Errorf("orphan key replacement not reported: %+v", res)
			}
		})
	}
}

func TestEnsureNewAddressNeedsForce(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	s := specByName(t, KonnectivityServer)
	oldKey, _ := os.ReadFile(s.KeyFile(cfg.PKIDir()))
	cfg.ControlPlaneAddresses = append(cfg.ControlPlaneAddresses, "198.18.0.2")
	before := snapshot(t, cfg.Dir)
	_, err := Ensure(cfg)
	if err == nil || !strings.Contains(err.Error(), s.CertFile(cfg.PKIDir())) || !strings.Contains(err.Error(), "SANs lack 198.18.0.2") {
		t.Fatalf("err = %v", err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("failed run changed %v", changed)
	}
	cfg.Force = true
	res := mustEnsure(t, cfg)
	if r := resultByName(t, res, KonnectivityServer); r.Action != Renewed {
		t.Fatalf("%+v", r)
	}
	cert := loadCert(t, s.CertFile(cfg.PKIDir()))
	if !slices.ContainsFunc(cert.IPAddresses, net.ParseIP("198.18.0.2").Equal) {
		t.Fatalf("renewed SANs %v", cert.IPAddresses)
	}
	if newKey, _ := os.ReadFile(s.KeyFile(cfg.PKIDir())); string(newKey) != string(oldKey) {
		t.Fatal("a sound key was replaced on renewal")
	}
	if r := resultByName(t, res, KonnectivityFrontend); r.Action != Renewed {
		t.Fatalf("frontend: %+v", r)
	}
	if r := resultByName(t, res, KonnectivityAgent); r.Action != Kept {
		t.Fatalf("--force renewed a sound leaf: %+v", r)
	}
}

func TestExternalCA(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	caKey := specByName(t, CA).KeyFile(dir)
	if err := os.Remove(caKey); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cfg.Dir)
	res := mustEnsure(t, cfg)
	for _, r := range res {
		wantExternal := !slices.Contains([]string{FrontProxyCA, FrontProxyClient, KonnectivityAgentCA, KonnectivityAgent}, r.Name)
		if r.Action != Kept || r.External != wantExternal {
			t.Errorf("%s: %s external=%v", r.Name, r.Action, r.External)
		}
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}

	leaf := specByName(t, KonnectivityFrontend)
	os.Remove(leaf.CertFile(dir))
	os.Remove(leaf.KeyFile(dir))
	before = snapshot(t, cfg.Dir)
	cfg.Force = true // cannot help: there is no key to sign with
	_, err := Ensure(cfg)
	if err == nil || !strings.Contains(err.Error(), leaf.CertFile(dir)+" is missing") || !strings.Contains(err.Error(), "external CA") {
		t.Fatalf("missing leaf under external CA: %v", err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("changed %v", changed)
	}
	// Without the frontend's certificate requested, the rest is fine.
	cfg.FrontendTLS = false
	mustEnsure(t, cfg)
}

func TestRefusesSharedCA(t *testing.T) {
	for _, tc := range []struct {
		name string
		prep func(t *testing.T, dir string)
		want string
	}{
		{"same certificate and key", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "front-proxy-ca.crt"))
			copyFile(t, filepath.Join(dir, "ca.key"), filepath.Join(dir, "front-proxy-ca.key"))
		}, "the same certificate as"},
		{"same certificate, no key", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "front-proxy-ca.crt"))
		}, "the same certificate as"},
		{"same key, other certificate", func(t *testing.T, dir string) {
			key, _, err := readKey(filepath.Join(dir, "ca.key"))
			if err != nil {
				t.Fatal(err)
			}
			fp := specByName(t, FrontProxyCA)
			cert, err := signCert(fp, key.Public(), AltNames{}, nil, key, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := writePair(fp.CertFile(dir), fp.KeyFile(dir), cert, key, true); err != nil {
				t.Fatal(err)
			}
		}, "the same key as"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			mustEnsure(t, cfg, CA)
			dir := cfg.PKIDir()
			tc.prep(t, dir)
			before := snapshot(t, cfg.Dir)
			for _, names := range [][]string{nil, {FrontProxyCA}, {FrontProxyClient}} {
				_, err := Ensure(cfg, names...)
				if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "front-proxy-ca.crt")+" is "+tc.want) ||
					!strings.Contains(err.Error(), "--requestheader-allowed-names") {
					t.Fatalf("Ensure(%v): %v", names, err)
				}
			}
			if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
				t.Fatalf("changed %v", changed)
			}
		})
	}
}

// TestBadInputs: each broken file gives an error naming it, and nothing is written.
func TestBadInputs(t *testing.T) {
	leaf := specByName(t, KonnectivityServer)
	for _, tc := range []struct {
		name  string
		prep  func(t *testing.T, cfg Config) (file string)
		want  string
		force bool // whether --force repairs it
	}{
		{"corrupt certificate PEM", func(t *testing.T, cfg Config) string {
			f := leaf.CertFile(cfg.PKIDir())
			os.WriteFile(f, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"), 0o644)
			return f
		}, "no PEM certificate found", true},
		{"corrupt key PEM", func(t *testing.T, cfg Config) string {
			f := leaf.KeyFile(cfg.PKIDir())
			os.WriteFile(f, []byte("garbage"), 0o600)
			return f
		}, "no PEM private key found", true},
		{"key not matching certificate", func(t *testing.T, cfg Config) string {
			copyFile(t, specByName(t, KonnectivityAgent).KeyFile(cfg.PKIDir()), leaf.KeyFile(cfg.PKIDir()))
			return leaf.CertFile(cfg.PKIDir())
		}, "the key does not match the certificate", true},
		{"expired leaf", func(t *testing.T, cfg Config) string {
			os.Remove(leaf.CertFile(cfg.PKIDir()))
			os.Remove(leaf.KeyFile(cfg.PKIDir()))
			old := cfg
			old.Now = func() time.Time { return time.Now().Add(-2 * DefaultCertValidity) }
			mustEnsure(t, old, KonnectivityServer)
			return leaf.CertFile(cfg.PKIDir())
		}, "expired on", true},
		{"leaf from another CA", func(t *testing.T, cfg Config) string {
			other := testConfig(t)
			mustEnsure(t, other, KonnectivityServer)
			copyFile(t, leaf.CertFile(other.PKIDir()), leaf.CertFile(cfg.PKIDir()))
			copyFile(t, leaf.KeyFile(other.PKIDir()), leaf.KeyFile(cfg.PKIDir()))
			return leaf.CertFile(cfg.PKIDir())
		}, "not signed by ca.crt", true},
		{"leaf with system:masters", func(t *testing.T, cfg Config) string {
			s := specByName(t, KonnectivityServerClient)
			key, _, _ := readKey(s.KeyFile(cfg.PKIDir()))
			ca := specByName(t, CA)
			caCert := loadCert(t, ca.CertFile(cfg.PKIDir()))
			caKey, _, _ := readKey(ca.KeyFile(cfg.PKIDir()))
			s.Organization = []string{"system:masters"}
			cert, err := signCert(s, key.Public(), AltNames{}, caCert, caKey, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(s.CertFile(cfg.PKIDir()), encodeCert(cert), 0o644)
			return s.CertFile(cfg.PKIDir())
		}, `subject O is ["system:masters"], want []`, true},
		{"corrupt CA certificate", func(t *testing.T, cfg Config) string {
			f := specByName(t, CA).CertFile(cfg.PKIDir())
			os.WriteFile(f, []byte("nope"), 0o644)
			return f
		}, "no PEM certificate found", false},
		{"CA key not matching", func(t *testing.T, cfg Config) string {
			copyFile(t, specByName(t, FrontProxyCA).KeyFile(cfg.PKIDir()), specByName(t, CA).KeyFile(cfg.PKIDir()))
			return specByName(t, CA).KeyFile(cfg.PKIDir())
		}, "does not match", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			mustEnsure(t, cfg)
			file := tc.prep(t, cfg)
			before := snapshot(t, cfg.Dir)
			_, err := Ensure(cfg)
			if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %s and say %q", err, file, tc.want)
			}
			if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
				t.Fatalf("failed run changed %v", changed)
			}
			// --force re-signs a key that parses: a sound key is never replaced.
			keyFile := leaf.KeyFile(cfg.PKIDir())
			_, soundKey, keyErr := readKey(keyFile)
			cfg.Force = true
			_, err = Ensure(cfg)
			if tc.force != (err == nil) {
				t.Fatalf("with --force: %v", err)
			}
			if after, _ := os.ReadFile(keyFile); keyErr == nil && string(after) != string(soundKey) {
				t.Fatalf("--force replaced the sound key %s", keyFile)
			}
			if err == nil {
				mustEnsure(t, Config{Dir: cfg.Dir, ControlPlaneAddresses: cfg.ControlPlaneAddresses, Hostname: cfg.Hostname, AgentMTLS: true, FrontendTLS: true})
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"address", func(c *Config) { c.ControlPlaneAddresses = []string{"not an address!"} }, `"not an address!" is neither`},
		{"key algorithm", func(c *Config) { c.KeyAlgorithm = "rsa-1024" }, `unknown key algorithm "rsa-1024"`},
		{"unknown name", func(c *Config) {}, `unknown certificate "apiserver"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.edit(&cfg)
			var names []string
			if tc.name == "unknown name" {
				names = []string{"apiserver"}
			}
			if _, err := Ensure(cfg, names...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(cfg.Dir); len(entries) != 0 {
				t.Fatalf("wrote %v", entries)
			}
		})
	}
}

func TestUnwritableDir(t *testing.T) {
	parent := t.TempDir()
	blocker := filepath.Join(parent, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Dir = filepath.Join(blocker, "kubernetes") // a regular file in the path: unwritable even for root
	_, err := Ensure(cfg)
	if err == nil || !strings.Contains(err.Error(), cfg.Dir) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("err = %v", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Fatalf("wrote %v", entries)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.DryRun = true
	res := mustEnsure(t, cfg)
	for _, r := range res {
		if r.Action != Created || !r.DryRun || !strings.Contains(r.String(), "would be created") {
			t.Errorf("%s", r)
		}
	}
	if entries, _ := os.ReadDir(cfg.Dir); len(entries) != 0 {
		t.Fatalf("dry run wrote %v", entries)
	}
}

func TestExplicitNameNeedsItsCA(t *testing.T) {
	cfg := testConfig(t)
	cfg.AgentMTLS = false
	res := mustEnsure(t, cfg, KonnectivityAgent) // named, so created although not enabled
	var names []string
	for _, r := range res {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{KonnectivityAgentCA, KonnectivityAgent}) {
		t.Fatalf("got %v", names)
	}
}

// TestOpenSSLVerify runs the real openssl on every leaf, with the purpose each one is for.
func TestOpenSSLVerify(t *testing.T) {
	openssl := opensslOrSkip(t)
	cfg := testConfig(t)
	cfg.KeyAlgorithm = RSA2048
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	for _, s := range Specs() {
		if s.IsCA {
			continue
		}
		purpose := "sslclient"
		if slices.Contains(s.Usages, x509.ExtKeyUsageServerAuth) {
			purpose = "sslserver"
		}
		ca := specByName(t, s.CA).CertFile(dir)
		out, err := exec.Command(openssl, "verify", "-purpose", purpose, "-CAfile", ca, s.CertFile(dir)).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ": OK") {
			t.Errorf("openssl verify %s: %v\n%s", s.Name, err, out)
		}
		other := specByName(t, FrontProxyCA).CertFile(dir)
		if s.CA == FrontProxyCA {
			other = specByName(t, CA).CertFile(dir)
		}
		if out, err := exec.Command(openssl, "verify", "-CAfile", other, s.CertFile(dir)).CombinedOutput(); err == nil {
			t.Errorf("openssl verify %s against the wrong CA succeeded:\n%s", s.Name, out)
		}
		// openssl must also accept the key as the certificate's.
		pubCert, err1 := exec.Command(openssl, "x509", "-noout", "-pubkey", "-in", s.CertFile(dir)).Output()
		pubKey, err2 := exec.Command(openssl, "pkey", "-pubout", "-in", s.KeyFile(dir)).Output()
		if err1 != nil || err2 != nil || string(pubCert) != string(pubKey) {
			t.Errorf("openssl: %s key and certificate differ (%v, %v)", s.Name, err1, err2)
		}
	}
}

func TestWriteFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "f")
	changed, err := WriteFile(path, []byte("one"), 0o600, 0o700)
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	st, _ := os.Stat(path)
	dst, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o600 || dst.Mode().Perm() != 0o700 {
		t.Fatalf("modes %v %v", st.Mode(), dst.Mode())
	}
	// Backdate the file so that any rewrite would show as a new mtime, without waiting for the clock.
	mtime := st.ModTime().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteFile(path, []byte("one"), 0o600, 0o700); err != nil || changed {
		t.Fatalf("same content rewritten: %v %v", changed, err)
	}
	if st, _ := os.Stat(path); !st.ModTime().Equal(mtime) {
		t.Fatal("mtime changed")
	}
	if changed, err := WriteFile(path, []byte("one"), 0o644, 0o700); err != nil || !changed {
		t.Fatalf("mode change not written: %v %v", changed, err)
	}
	if _, err := WriteFile(path, []byte("two"), 0o644, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if _, err := WriteFile(filepath.Join(path, "x"), nil, 0o600, 0o700); err == nil || !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), path) {
		t.Fatalf("write under a file: %v", err)
	}
}

// TestWriteFileThroughSymlink: a symlinked file (a CA shared by several directories) is written through the
// link, which stays, and the stale temporary files of a killed write are looked for beside the target.
func TestWriteFileThroughSymlink(t *testing.T) {
	tmp := t.TempDir()
	shared := filepath.Join(tmp, "shared", "ca.crt")
	if _, err := WriteFile(shared, []byte("old"), 0o644, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "pki", "ca.crt")
	os.MkdirAll(filepath.Dir(link), 0o700)
	if err := os.Symlink("../shared/ca.crt", link); err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteFile(link, []byte("new"), 0o644, 0o700); err != nil || !changed {
		t.Fatalf("WriteFile through a link: %v %v", changed, err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi.Mode(), err)
	}
	if data, _ := os.ReadFile(shared); string(data) != "new" {
		t.Fatalf("target holds %q", data)
	}
	stale := filepath.Join(filepath.Dir(shared), ".ca.crt.tmp-123")
	os.WriteFile(stale, []byte("key"), 0o600)
	RemoveStaleTemps(link)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale temporary file beside the target kept: %v", err)
	}
	dangling := filepath.Join(tmp, "pki", "gone.crt")
	os.Symlink("../nowhere/gone.crt", dangling)
	if _, err := WriteFile(dangling, []byte("x"), 0o644, 0o700); err == nil || !strings.Contains(err.Error(), dangling) {
		t.Errorf("dangling link: %v", err)
	}
}

// TestEnsureRefusesServingDir: an extension server's directory (konnect certs apiservice --out) holds that
// server's serving CA as ca.crt, which must not become a control plane's cluster CA.
func TestEnsureRefusesServingDir(t *testing.T) {
	cfg := testConfig(t)
	if _, _, err := EnsureServing(Config{Dir: cfg.PKIDir(), KeyAlgorithm: ECDSAP256}, "api", "wardle"); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cfg.Dir)
	if _, err := Ensure(cfg); err == nil || !strings.Contains(err.Error(), "extension server's certificates") {
		t.Fatalf("Ensure in an extension server's directory: %v", err)
	}
	if changed := diffSnapshots(before, snapshot(t, cfg.Dir)); len(changed) > 0 {
		t.Fatalf("Ensure changed %v", changed)
	}
}

// TestSubjectRules: a client certificate's subject is its identity and must be exact; a serving
// certificate (say, issued by an external CA) may carry any subject as long as its SANs fit.
func TestSubjectRules(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	caCert, caKey := clusterCA(t, dir)
	resign := func(name, cn string, an AltNames) {
		s := specByName(t, name)
		key, _, _ := readKey(s.KeyFile(dir))
		s.CommonName, s.Organization = cn, []string{"Example Corp"}
		cert, err := signCert(s, key.Public(), an, caCert, caKey, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(s.CertFile(dir), encodeCert(cert), 0o644)
	}
	resign(KonnectivityServer, "konnectivity.example.com", specByName(t, KonnectivityServer).AltNames(&cfg))
	mustEnsure(t, cfg)
	resign(KonnectivityAgent, "someone-else", AltNames{})
	_, err := Ensure(cfg)
	if err == nil || !strings.Contains(err.Error(), `subject CN is "someone-else"`) || !strings.Contains(err.Error(), `subject O is ["Example Corp"]`) {
		t.Fatalf("client certificate with another subject: %v", err)
	}
}

// TestAgentCertificateMovesToItsCA: earlier releases signed the agents' certificate with the cluster CA,
// which made it a credential for kube-apiserver. Such a certificate is replaced by one the agents' own CA
// signs, with a new key, without --force; the old pair is kept in RetiredSubdir. Anything else wrong with
// it still needs --force.
func TestAgentCertificateMovesToItsCA(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	caCert, caKey := clusterCA(t, dir)
	agent := specByName(t, KonnectivityAgent)
	key, _, _ := readKey(agent.KeyFile(dir))
	old, err := signCert(agent, key.Public(), AltNames{}, caCert, caKey, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(agent.CertFile(dir), encodeCert(old), 0o644)
	keyBefore, _ := os.ReadFile(agent.KeyFile(dir))
	// As an earlier release left the directory: no agents' CA.
	agentCA := specByName(t, KonnectivityAgentCA)
	os.Remove(agentCA.CertFile(dir))
	os.Remove(agentCA.KeyFile(dir))

	// Before init has moved it, renew says to run init, and check-expiration shows who signed it.
	if _, err := Renew(cfg, All); err == nil || !strings.Contains(err.Error(), "run konnect init first") {
		t.Errorf("renew before the move: %v", err)
	}
	exps, err := CheckExpiration(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exps {
		if e.Name == KonnectivityAgent && (e.External || e.Issuer != caCert.Subject.CommonName) {
			t.Errorf("check-expiration before the move: %+v", e)
		}
	}

	r := resultByName(t, mustEnsure(t, cfg), KonnectivityAgent)
	if r.Action != Renewed || !strings.HasPrefix(r.Reason, "moved from ca.crt to konnectivity-agent-ca.crt with a new key") ||
		!strings.Contains(r.Reason, old.NotAfter.UTC().Format(time.RFC3339)) {
		t.Fatalf("result %+v", r)
	}
	moved := loadCert(t, agent.CertFile(dir))
	if err := moved.CheckSignatureFrom(loadCert(t, specByName(t, KonnectivityAgentCA).CertFile(dir))); err != nil {
		t.Errorf("not signed by the agents' CA: %v", err)
	}
	if moved.CheckSignatureFrom(caCert) == nil {
		t.Error("still signed by the cluster CA")
	}
	if keyAfter, _ := os.ReadFile(agent.KeyFile(dir)); string(keyAfter) == string(keyBefore) {
		t.Error("the key the old certificate was issued for is still in use")
	}
	base := filepath.Join(dir, RetiredSubdir, "konnectivity-agent-"+strings.ToLower(old.SerialNumber.Text(16)))
	if retiredKey, err := os.ReadFile(base + ".key"); err != nil || string(retiredKey) != string(keyBefore) {
		t.Errorf("the old key is not kept in %s.key: %v", base, err)
	}
	if retired := loadCert(t, base+".crt"); !retired.Equal(old) {
		t.Errorf("%s.crt is not the old certificate", base)
	}
	if r := resultByName(t, mustEnsure(t, cfg), KonnectivityAgent); r.Action != Kept {
		t.Errorf("second run: %+v", r)
	}
}

func TestLeafNeverOutlivesCA(t *testing.T) {
	cfg := testConfig(t)
	cfg.CAValidity, cfg.CertValidity = 2*time.Hour, time.Hour
	mustEnsure(t, cfg, CA)
	cfg.CAValidity, cfg.CertValidity = DefaultCAValidity, DefaultCertValidity
	res := mustEnsure(t, cfg, KonnectivityServer)
	ca := loadCert(t, specByName(t, CA).CertFile(cfg.PKIDir()))
	leaf := loadCert(t, specByName(t, KonnectivityServer).CertFile(cfg.PKIDir()))
	if !leaf.NotAfter.Equal(ca.NotAfter) {
		t.Fatalf("leaf expires %v, CA %v", leaf.NotAfter, ca.NotAfter)
	}
	if r := resultByName(t, res, KonnectivityServer); !strings.Contains(r.Reason, "cut to the CA's expiry") {
		t.Fatalf("%+v", r)
	}
}

// TestOpenKeyIsReported: a key that others can read is kept, as every existing file is, but the result says
// so and how to fix it.
func TestOpenKeyIsReported(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	for _, name := range []string{CA, KonnectivityServer} {
		if err := os.Chmod(specByName(t, name).KeyFile(cfg.PKIDir()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range mustEnsure(t, cfg) {
		open := r.Name == CA || r.Name == KonnectivityServer
		if r.Action != Kept || open != strings.Contains(r.Reason, "chmod 600 "+r.KeyFile) {
			t.Errorf("%s: %s %q", r.Name, r.Action, r.Reason)
		}
	}
	if fi, _ := os.Stat(specByName(t, CA).KeyFile(cfg.PKIDir())); fi.Mode().Perm() != 0o644 {
		t.Errorf("an existing key's mode was changed to %v", fi.Mode().Perm())
	}
}

// TestCAKeyWithoutCertificateKeepsItsSubject: a lost ca.crt of someone else's CA (kubeadm's "kubernetes") is
// re-created with the subject its leaves name as their issuer, so that they still verify.
func TestCAKeyWithoutCertificateKeepsItsSubject(t *testing.T) {
	cfg := testConfig(t)
	dir := cfg.PKIDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	key, err := generateKey(ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	ca := specByName(t, CA)
	kubeadm := func(c *x509.Certificate) { c.Subject = pkix.Name{CommonName: "kubernetes"} }
	caCert, err := signCert(ca, key.Public(), AltNames{}, nil, key, time.Now(), time.Hour, kubeadm)
	if err != nil {
		t.Fatal(err)
	}
	kubelet := *specByName(t, KonnectivityServerClient)
	kubelet.CommonName = "kube-apiserver-kubelet-client"
	kubeletKey, _ := generateKey(ECDSAP256)
	leaf, err := signCert(&kubelet, kubeletKey.Public(), AltNames{}, caCert, key, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePair(filepath.Join(dir, "apiserver-kubelet-client.crt"), filepath.Join(dir, "apiserver-kubelet-client.key"), leaf, kubeletKey, true); err != nil {
		t.Fatal(err)
	}
	if err := writePair(ca.CertFile(dir), ca.KeyFile(dir), caCert, key, true); err != nil {
		t.Fatal(err)
	}
	os.Remove(ca.CertFile(dir))
	mustEnsure(t, cfg, CA)
	recreated, _, err := readCert(ca.CertFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	if recreated.Subject.CommonName != "kubernetes" {
		t.Errorf("re-created CA subject %q, want the leaves' issuer CN=kubernetes", recreated.Subject)
	}
	pool := x509.NewCertPool()
	pool.AddCert(recreated)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("a leaf of the lost CA certificate does not verify against the re-created one: %v", err)
	}
}

// TestCAKeyWithoutCertificate is what a kill between writing a CA's key and its certificate leaves (or a lost
// ca.crt): the key is kept, a certificate is made for it, and every leaf it signed still verifies and is kept.
func TestCAKeyWithoutCertificate(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	ca := specByName(t, CA)
	keyBefore, err := os.ReadFile(ca.KeyFile(cfg.PKIDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ca.CertFile(cfg.PKIDir())); err != nil {
		t.Fatal(err)
	}
	results := mustEnsure(t, cfg)
	for _, r := range results {
		want := Kept
		if r.Name == CA {
			want = Created
		}
		if r.Action != want {
			t.Errorf("%s: %s, want %s", r.Name, r.Action, want)
		}
	}
	keyAfter, err := os.ReadFile(ca.KeyFile(cfg.PKIDir()))
	if err != nil || string(keyAfter) != string(keyBefore) {
		t.Fatalf("the CA key changed (err %v)", err)
	}
	caCert, _, err := readCert(ca.CertFile(cfg.PKIDir()))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	leaf, _, err := readCert(specByName(t, KonnectivityServer).CertFile(cfg.PKIDir()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("a leaf signed before the CA certificate was re-created no longer verifies: %v", err)
	}
}

// clusterCA reads the cluster CA's certificate and key from dir.
func clusterCA(t *testing.T, dir string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	ca := specByName(t, CA)
	key, _, err := readKey(ca.KeyFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	return loadCert(t, ca.CertFile(dir)), key
}

// TestForceKeepsWhatItReplaces: a leaf renewed only because of Force keeps the files it replaces beside
// them: the certificate, and a key konnect cannot parse (which may be someone's only copy of it, in a form
// konnect does not read). A sound key is re-signed, not replaced, so it needs no copy.
func TestForceKeepsWhatItReplaces(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	server, agent := specByName(t, KonnectivityServer), specByName(t, KonnectivityAgent)
	serverCert, _ := os.ReadFile(server.CertFile(dir))
	agentCert, _ := os.ReadFile(agent.CertFile(dir))
	odd := []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nnot one konnect reads\n-----END OPENSSH PRIVATE KEY-----\n")
	if err := os.WriteFile(agent.KeyFile(dir), odd, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ControlPlaneAddresses = append(cfg.ControlPlaneAddresses, "198.18.0.2") // the server's SANs lack it
	cfg.Force = true
	res := mustEnsure(t, cfg)

	for _, c := range []struct {
		name   string
		kept   map[string][]byte // file replaced -> its content before
		absent []string
	}{
		{KonnectivityServer, map[string][]byte{server.CertFile(dir): serverCert}, []string{server.KeyFile(dir)}},
		{KonnectivityAgent, map[string][]byte{agent.CertFile(dir): agentCert, agent.KeyFile(dir): odd}, nil},
	} {
		r := resultByName(t, res, c.name)
		if r.Action != Renewed {
			t.Fatalf("%s: %+v, want renewed", c.name, r)
		}
		for file, before := range c.kept {
			backups, _ := filepath.Glob(filepath.Join(dir, "."+filepath.Base(file)+".konnect-backup-*"))
			if len(backups) != 1 || !strings.Contains(r.Backup, backups[0]) {
				t.Fatalf("%s: backups of %s %v, result names %q", c.name, file, backups, r.Backup)
			}
			got, _ := os.ReadFile(backups[0])
			fi, _ := os.Stat(backups[0])
			want := CertMode
			if strings.HasSuffix(file, ".key") {
				want = KeyMode
			}
			if string(got) != string(before) || fi.Mode().Perm() != want {
				t.Errorf("%s: backup %s holds %q (mode %v), want what %s held (mode %v)", c.name, backups[0], got, fi.Mode().Perm(), file, want)
			}
		}
		for _, file := range c.absent {
			if backups, _ := filepath.Glob(filepath.Join(dir, "."+filepath.Base(file)+".konnect-backup-*")); len(backups) != 0 {
				t.Errorf("%s: a sound key, re-signed, was copied: %v", c.name, backups)
			}
		}
	}
	if r := resultByName(t, res, KonnectivityFrontend); r.Action != Renewed || r.Backup == "" {
		t.Errorf("frontend: %+v, want renewed with a backup", r)
	}
}
