package pki

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/konnect-dev/konnect/pki/field"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Names inside the Konnectivity server's kubeconfig.
const (
	kubeconfigCluster = "kubernetes"
	kubeconfigUser    = ServerUser
	kubeconfigContext = kubeconfigUser + "@" + kubeconfigCluster
)

// ValidateAPIServerURL accepts an https URL with a host and nothing after the path.
func ValidateAPIServerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("API server URL %q: %w", s, err)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("API server URL %q: scheme must be https", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("API server URL %q: no host", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("API server URL %q: must not carry user info, query or fragment", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("API server URL %q: port %s is out of range (1-65535)", s, p)
		}
	}
	return nil
}

// EnsureKubeconfig writes DIR/konnectivity-server.conf: the cluster CA, the embedded
// konnectivity-server-client certificate and key, and apiserverURL. The embedded certificates always
// follow the files in DIR/pki (so a renewed client certificate reaches the kubeconfig); a different
// server URL in an existing file, or one that is no kubeconfig, is an error unless cfg.Force, which keeps a
// backup of it beside it (Backup, mode 0600).
func EnsureKubeconfig(cfg Config, apiserverURL string) (Result, error) {
	cfg = cfg.withDefaults()
	path := cfg.KubeconfigPath()
	res := Result{Name: "kubeconfig", CertFile: path}
	if err := ValidateAPIServerURL(apiserverURL); err != nil {
		return res, fmt.Errorf("pki: %s: %w", path, err)
	}
	specs := Specs()
	caSpec, _ := Lookup(specs, CA)
	client, _ := Lookup(specs, KonnectivityServerClient)
	dir := cfg.PKIDir()
	if err := checkTrusted(dir, caSpec.CertFile(dir), client.CertFile(dir), client.KeyFile(dir)); err != nil {
		return res, fmt.Errorf("pki: kubeconfig %s: %w", path, err)
	}
	if cfg.DryRun && !exists(client.CertFile(dir)) {
		res.Action, res.DryRun = Created, true
		if exists(path) {
			res.Action = Updated
		}
		return res, nil
	}
	data, notAfter, err := renderKubeconfig(caSpec.CertFile(dir), client.CertFile(dir), client.KeyFile(dir), apiserverURL)
	res.NotAfter = notAfter
	if err != nil {
		return res, fmt.Errorf("pki: kubeconfig %s: %w", path, err)
	}
	old, err := smallfile.Read(path)
	switch {
	case os.IsNotExist(err):
		res.Action = Created
	case err != nil:
		return res, fmt.Errorf("pki: read %s: %w", path, err)
	case bytes.Equal(old, data):
		res.Action = Kept
		// It carries the client key: one that others may read is closed as WriteFile closes a key it writes.
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() != KeyMode {
			res.Action = Updated
			res.Reason = fmt.Sprintf("mode %04o, readable by others, set to %04o: it holds a private key", st.Mode().Perm(), KeyMode)
		}
	default:
		res.Action = Updated
		res.Reason = "embedded certificates changed"
		server, perr := kubeconfigServer(old)
		switch {
		case perr != nil && !cfg.Force:
			return res, field.Errorf("pki: %s: %w (run with {Force} to rewrite it)", path, perr)
		case perr == nil && server != apiserverURL && !cfg.Force:
			return res, field.Errorf("pki: %s points at server %q, not %q (run with {Force} to rewrite it)", path, server, apiserverURL)
		case perr != nil || server != apiserverURL:
			res.Reason, res.Forced = "rewritten", true
		}
	}
	if cfg.DryRun {
		res.DryRun = res.Action != Kept
		return res, nil
	}
	RemoveStaleTemps(path)
	if res.Forced {
		// Another server URL, or content that is no kubeconfig, was put there by hand: kept as a replaced
		// manifest is, closed because it may hold the client key.
		backup, err := Backup(path, "", old, KeyMode, cfg.now())
		if err != nil {
			return res, fmt.Errorf("pki: %w", err)
		}
		res.Backup = backup
	}
	if res.Action != Kept {
		// The kubeconfig carries a private key.
		if _, err := WriteFile(path, data, KeyMode, 0o755); err != nil {
			return res, fmt.Errorf("pki: %w", err)
		}
	}
	return res, nil
}

func renderKubeconfig(caFile, certFile, keyFile, server string) ([]byte, time.Time, error) {
	_, caPEM, err := readCert(caFile)
	if err != nil {
		return nil, time.Time{}, err
	}
	cert, certPEM, err := readCert(certFile)
	if err != nil {
		return nil, time.Time{}, err
	}
	key, keyPEM, err := readKey(keyFile)
	if err != nil {
		return nil, time.Time{}, err
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, time.Time{}, fmt.Errorf("%s does not match %s", keyFile, certFile)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[kubeconfigCluster] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	kc.AuthInfos[kubeconfigUser] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts[kubeconfigContext] = &clientcmdapi.Context{Cluster: kubeconfigCluster, AuthInfo: kubeconfigUser}
	kc.CurrentContext = kubeconfigContext
	data, err := clientcmd.Write(*kc)
	return data, cert.NotAfter, err
}

// currentContext parses a kubeconfig and returns it with its current context.
func currentContext(data []byte) (*clientcmdapi.Config, *clientcmdapi.Context, error) {
	kc, err := clientcmd.Load(data)
	if err != nil {
		return nil, nil, fmt.Errorf("parse kubeconfig: %w", err)
	}
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok {
		return nil, nil, fmt.Errorf("current context %q not found", kc.CurrentContext)
	}
	return kc, ctx, nil
}

// kubeconfigServer returns the server of a kubeconfig's current context.
func kubeconfigServer(data []byte) (string, error) {
	kc, ctx, err := currentContext(data)
	if err != nil {
		return "", err
	}
	cl, ok := kc.Clusters[ctx.Cluster]
	if !ok {
		return "", fmt.Errorf("cluster %q not found", ctx.Cluster)
	}
	return cl.Server, nil
}

// kubeconfigClientCert returns the client certificate embedded in a kubeconfig's current context.
func kubeconfigClientCert(data []byte) ([]byte, error) {
	kc, ctx, err := currentContext(data)
	if err != nil {
		return nil, err
	}
	ai, ok := kc.AuthInfos[ctx.AuthInfo]
	if !ok || len(ai.ClientCertificateData) == 0 {
		return nil, fmt.Errorf("no embedded client certificate for user %q", ctx.AuthInfo)
	}
	return ai.ClientCertificateData, nil
}
