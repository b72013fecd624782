package initcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// defaultImage is the image `make image` builds from the same commit as this binary: the manifests then run
// the konnect that wrote them, never a moving ":latest". A binary built without the Makefile takes its
// version from the Go toolchain's build information (buildinfo.FromBuildInfo).
func defaultImage() string { return manifests.Image(buildinfo.Version) }

func (r *runner) manifests([]string) error {
	o := r.o
	mtls := o.AgentAuth == AgentAuthMTLS
	srv := o.serverManifest()
	digest, err := manifests.FilesDigest(srv.MountedFiles())
	if err != nil {
		return err
	}
	srv.FilesDigest = digest
	pod, err := srv.Render()
	if err != nil {
		return err
	}
	// Agents check the server's certificate against the CA that signed it, which need not be the CA that
	// kube-controller-manager publishes in kube-root-ca.crt.
	caPEM, err := smallfile.Read(o.pkiPath(pki.CA, false))
	if err != nil && !(o.DryRun && os.IsNotExist(err)) {
		return err
	}
	agent := manifests.Agent{Image: o.Image, ProxyServerHost: o.ControlPlaneAddresses[0], CACert: caPEM,
		ServerLeases: o.ServerLeases, APIServerURL: o.APIServerURL}
	// A dry run on a fresh directory cannot render the agents' files: the CA ConfigMap needs ca.crt, and the
	// Secret (--agent-auth mtls) a key, which do not exist yet.
	waitingFor := ""
	if caPEM == nil {
		waitingFor = filepath.Base(o.pkiPath(pki.CA, false))
	}
	if mtls {
		var missing bool
		agent.ClientCert, agent.ClientKey, missing, err = readPair(o.pkiPath(pki.KonnectivityAgent, false), o.pkiPath(pki.KonnectivityAgent, true))
		if err != nil && !(o.DryRun && missing) {
			return fmt.Errorf("--agent-auth %s: %w (the certs phase creates it)", AgentAuthMTLS, err)
		}
		if err != nil {
			waitingFor = strings.TrimPrefix(waitingFor+" and "+filepath.Base(o.pkiPath(pki.KonnectivityAgent, false))+" with its key", " and ")
		}
	}
	pending := waitingFor != ""
	var files []manifests.File
	if !pending {
		if files, err = agent.Render(); err != nil {
			return err
		}
	}
	agentDir := filepath.Join(o.Dir, manifests.AgentBundleDir)
	if err := r.writeFiles(filepath.Join(o.Dir, ManifestsSubdir), []manifests.File{pod}); err != nil {
		return err
	}
	files, changes, err := manifests.PrepareAgentBundle(agentDir, filepath.Join(o.Dir, ManifestsSubdir, manifests.AgentBundleDir), files, o.DryRun)
	for _, c := range changes {
		r.outcomes = append(r.outcomes, outcome{action: c.Action, dryRun: c.DryRun, file: c.Path, note: c.Note})
	}
	if err != nil {
		return err
	}
	if pending {
		r.outcomes = append(r.outcomes, outcome{action: pki.Created, dryRun: true, file: agentDir + string(filepath.Separator),
			note: "rendered once the certs phase has written " + waitingFor})
		return nil
	}
	return r.writeFiles(agentDir, files)
}

// serverManifest is the Konnectivity server's static pod as the options describe it.
func (o *Options) serverManifest() manifests.Server {
	srv := manifests.Server{
		Image:       o.Image,
		Mode:        string(o.Mode),
		ClusterCert: o.pkiPath(pki.KonnectivityServer, false),
		ClusterKey:  o.pkiPath(pki.KonnectivityServer, true),
	}
	if o.AgentAuth == AgentAuthMTLS {
		// konnectivity-agent.crt is signed by a CA of its own, which kube-apiserver does not trust; the server
		// reviews no tokens then.
		srv.AgentClientCA = o.pkiPath(pki.KonnectivityAgentCA, false)
		srv.AgentAllowedNames = []string{pki.AgentUser}
	}
	if o.AgentAuth != AgentAuthMTLS || o.ServerLeases {
		srv.Kubeconfig = filepath.Join(o.Dir, pki.KubeconfigFile)
	}
	srv.LeaseController = o.ServerLeases
	if o.Transport == kubeapiserver.TransportTCP {
		srv.FrontendBindAddress = "127.0.0.1"
		srv.FrontendPort = o.FrontendPort
		srv.ServerCert = o.pkiPath(pki.KonnectivityFrontend, false)
		srv.ServerKey = o.pkiPath(pki.KonnectivityFrontend, true)
		srv.ServerCACert = o.pkiPath(pki.CA, false)
		srv.FrontendAllowedNames = []string{pki.EgressClientUser}
	} else {
		srv.UDSName = o.UDSName
		srv.AllowSharedUDSDir = o.AllowSharedUDSDir
	}
	return srv
}

// pkiPath is the certificate (or with key, the key) of the named pki spec under DIR/pki.
func (o *Options) pkiPath(name string, key bool) string {
	s, _ := pki.Lookup(pki.Specs(), name)
	if key {
		return s.KeyFile(o.pkiDir())
	}
	return s.CertFile(o.pkiDir())
}

// readPair reads a certificate and its key; missing says whether either file does not exist.
func readPair(certFile, keyFile string) (cert, key []byte, missing bool, err error) {
	cert, err = smallfile.Read(certFile)
	if err != nil {
		return nil, nil, os.IsNotExist(err), err
	}
	key, err = smallfile.Read(keyFile)
	if err != nil {
		return nil, nil, os.IsNotExist(err), err
	}
	return cert, key, false, nil
}
