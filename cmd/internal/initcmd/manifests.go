package initcmd

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/konnect-dev/konnect/egress"
	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// AgentBundleDir holds the cluster-side manifests (DaemonSet, ServiceAccount, RBAC) for `kubectl apply -k`,
// under --dir beside ManifestsSubdir, not in it: with --dir /etc/kubernetes, DIR/manifests is kubelet's
// static-pod directory, and kubelet logs an error for every directory it finds there at each scan (20 s).
const AgentBundleDir = "konnectivity-agent"

// What init did to a file or directory besides writing it.
const (
	movedTo pki.Action = "moved"   // the note says where
	removed pki.Action = "removed" // a file an earlier run wrote that this run does not
)

// defaultImage is the image `make image` builds from the same commit as this binary: the manifests then run
// the konnect that wrote them, never a moving ":latest". A plain `go build` is version "devel", and so is
// its image.
func defaultImage() string { return manifests.Image(buildinfo.Version) }

func (r *runner) manifests([]string) error {
	o := r.o
	mtls := o.AgentAuth == AgentAuthMTLS
	srv := o.serverManifest()
	pod, err := srv.Render()
	if err != nil {
		return err
	}
	// Agents check the server's certificate against the CA that signed it, which need not be the CA that
	// kube-controller-manager publishes in kube-root-ca.crt.
	caPEM, err := os.ReadFile(o.pkiPath(pki.CA, false))
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
	agentDir := filepath.Join(o.Dir, AgentBundleDir)
	if err := r.writeFiles(filepath.Join(o.Dir, ManifestsSubdir), []manifests.File{pod}); err != nil {
		return err
	}
	if err := r.moveLegacyAgentBundle(agentDir); err != nil {
		return err
	}
	if pending {
		r.outcomes = append(r.outcomes, outcome{action: pki.Created, dryRun: true, file: agentDir + string(filepath.Separator),
			note: "rendered once the certs phase has written " + waitingFor})
		return nil
	}
	if err := r.removeStale(agentDir, files); err != nil {
		return err
	}
	return r.writeFiles(agentDir, files)
}

// moveLegacyAgentBundle moves the agents' bundle out of DIR/manifests, where konnect wrote it before, to
// agentDir. The directory moves whole, so that files a user added (a kustomize patch) come along, and init
// then rewrites its own files there as it did in the old place. If both exist, the old one stays and is named.
func (r *runner) moveLegacyAgentBundle(agentDir string) error {
	legacy := filepath.Join(r.o.Dir, ManifestsSubdir, AgentBundleDir)
	if fi, err := os.Lstat(legacy); err != nil || !fi.IsDir() {
		return nil
	}
	const why = "kubelet logs an error for each directory in its static-pod directory"
	switch _, err := os.Lstat(agentDir); {
	case err == nil:
		r.outcomes = append(r.outcomes, outcome{action: pki.Kept, file: legacy + string(filepath.Separator),
			note: "left by an older konnect: the bundle is now " + agentDir + "; delete this copy: " + why})
		return nil
	case !os.IsNotExist(err):
		return err
	}
	if !r.o.DryRun {
		if err := os.Rename(legacy, agentDir); err != nil {
			return fmt.Errorf("move the agents' bundle out of %s: %w", filepath.Dir(legacy), err)
		}
	}
	r.outcomes = append(r.outcomes, outcome{action: movedTo, dryRun: r.o.DryRun, file: legacy + string(filepath.Separator),
		note: "to " + agentDir + ": " + why})
	return nil
}

// removeStale removes the files an earlier run wrote into dir that this run does not: a feature turned off
// (--server-leases, or --agent-auth mtls with the Secret that holds the agents' key) would otherwise leave
// them there. Only files that the earlier kustomization.yaml listed, and whose objects all carry konnect's
// managed-by label, go. kubectl apply -k does not delete what they created, so the note says how.
func (r *runner) removeStale(dir string, files []manifests.File) error {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if yaml.Unmarshal(data, &k) != nil {
		return nil
	}
	for _, name := range k.Resources {
		if name != filepath.Base(name) || slices.ContainsFunc(files, func(f manifests.File) bool { return f.Name == name }) {
			continue
		}
		path := filepath.Join(dir, name)
		deletes, ok := konnectObjects(path)
		if !ok {
			continue
		}
		if !r.o.DryRun {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		r.outcomes = append(r.outcomes, outcome{action: removed, dryRun: r.o.DryRun, file: path,
			note: "no longer part of the bundle; kubectl apply -k leaves what it created: " + strings.Join(deletes, "; ")})
	}
	return nil
}

// konnectObjects reads the objects of a file konnect rendered and returns the kubectl commands that delete
// them; ok is false unless the file holds objects and every one carries konnect's managed-by label.
func konnectObjects(path string) (deletes []string, ok bool) {
	objs, err := objectsIn(path)
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	for _, obj := range objs {
		if obj.Kind == "" || obj.Labels[manifests.ManagedByLabel] != manifests.ManagedBy {
			return nil, false
		}
		cmd := "kubectl delete " + strings.ToLower(obj.Kind) + " " + obj.Name
		if obj.Namespace != "" {
			cmd += " -n " + obj.Namespace
		}
		deletes = append(deletes, cmd)
	}
	return deletes, true
}

// objectsIn reads the kind and metadata of every object in a YAML file of one or more documents.
func objectsIn(path string) ([]metav1.PartialObjectMetadata, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var objs []metav1.PartialObjectMetadata
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if err == io.EOF {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var obj metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objs = append(objs, obj)
	}
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
		srv.AgentAllowedNames = []string{konnectivity.AgentUser}
	}
	if o.AgentAuth != AgentAuthMTLS || o.ServerLeases {
		srv.Kubeconfig = filepath.Join(o.Dir, pki.KubeconfigFile)
	}
	srv.LeaseController = o.ServerLeases
	if o.Transport == egress.TransportTCP {
		srv.FrontendBindAddress = "127.0.0.1"
		srv.FrontendPort = o.FrontendPort
		srv.ServerCert = o.pkiPath(pki.KonnectivityFrontend, false)
		srv.ServerKey = o.pkiPath(pki.KonnectivityFrontend, true)
		srv.ServerCACert = o.pkiPath(pki.CA, false)
		srv.FrontendAllowedNames = []string{konnectivity.EgressClientUser}
	} else {
		srv.UDSName = o.UDSName
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
	cert, err = os.ReadFile(certFile)
	if err != nil {
		return nil, nil, os.IsNotExist(err), err
	}
	key, err = os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, os.IsNotExist(err), err
	}
	return cert, key, false, nil
}
