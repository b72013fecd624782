package initcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// The serving certificate of certs webhook and certs apiservice has the minimum lifetime of every other
// certificate unless --allow-short-validity is given; a zero or negative lifetime is refused even then. Each
// refusal names the flag and writes nothing.
func TestServingValidityMinimum(t *testing.T) {
	dir := t.TempDir()
	webhook := func(args ...string) []string {
		return append([]string{"certs", "webhook", "--service", "hook", "--namespace", "pizza", "--out", filepath.Join(dir, "hook")}, args...)
	}
	apiservice := func(args ...string) []string {
		return append([]string{"certs", "apiservice", "--service", "api", "--namespace", "pizza", "--group", "example.com", "--version", "v1", "--out", filepath.Join(dir, "api")}, args...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{webhook("--cert-validity-period", "1s"), "--cert-validity-period 1s: must be at least 1h0m0s (--allow-short-validity"},
		{webhook("--cert-validity-period", "59m"), "--cert-validity-period 59m0s: must be at least 1h0m0s"},
		{webhook("--cert-validity-period", "0s"), "--cert-validity-period 0s: must be positive"},
		{webhook("--cert-validity-period", "-1h"), "--cert-validity-period -1h0m0s: must be positive"},
		{webhook("--cert-validity-period", "0s", "--allow-short-validity"), "--cert-validity-period 0s: must be positive"},
		{webhook("--cert-validity-period", "-1s", "--allow-short-validity"), "--cert-validity-period -1s: must be positive"},
		{apiservice("--cert-validity-period", "1s"), "--cert-validity-period 1s: must be at least 1h0m0s"},
		{apiservice("--cert-validity-period", "0s", "--allow-short-validity"), "--cert-validity-period 0s: must be positive"},
	} {
		out, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("konnect %s: %v, want %q\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("refused runs wrote into %s: %v", dir, entries)
	}

	// With the opt-in, a serving certificate that expires at once is issued.
	mustRun(t, webhook("--cert-validity-period", "1s", "--allow-short-validity")...)
	data, err := smallfile.Read(filepath.Join(dir, "hook", pki.PKISubdir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ParseCertificatePEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if time.Until(cert.NotAfter) > time.Minute {
		t.Errorf("--cert-validity-period 1s --allow-short-validity: notAfter %s", cert.NotAfter)
	}
}
