package initcmd

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
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
	movedTo       pki.Action = "moved"               // the note says where
	removed       pki.Action = "removed"             // a file an earlier run wrote that this run does not
	leftInCluster pki.Action = "left in the cluster" // an object of an earlier bundle that this one lacks
)

// defaultImage is the image `make image` builds from the same commit as this binary: the manifests then run
// the konnect that wrote them, never a moving ":latest". A binary built without the Makefile takes its
// version from the Go toolchain's build information (buildinfo.FromBuildInfo).
func defaultImage() string { return manifests.Image(buildinfo.Version) }

func (r *runner) manifests([]string) error {
	o := r.o
	mtls := o.AgentAuth == AgentAuthMTLS
	srv := o.serverManifest()
	digest, err := filesDigest(srv.MountedFiles())
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
	earlier, err := r.moveLegacyAgentBundle(agentDir)
	if err != nil {
		return err
	}
	if pending {
		r.outcomes = append(r.outcomes, outcome{action: pki.Created, dryRun: true, file: agentDir + string(filepath.Separator),
			note: "rendered once the certs phase has written " + waitingFor})
		return nil
	}
	if err := r.tidyBundle(earlier, agentDir, files); err != nil {
		return err
	}
	if files, err = keepUserKustomization(earlier, files); err != nil {
		return err
	}
	return r.writeFiles(agentDir, files)
}

// keepUserKustomization carries what a user added to the bundle's kustomization.yaml, in the directory
// earlier, into this run's files.
func keepUserKustomization(earlier string, files []manifests.File) ([]manifests.File, error) {
	path := filepath.Join(earlier, "kustomization.yaml")
	existing, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return files, nil
	}
	if err != nil {
		return nil, err
	}
	for i, f := range files {
		if f.Name == "kustomization.yaml" {
			if files[i], err = manifests.KeepUserKustomization(f, existing, manifests.AgentBundleFiles); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	return files, nil
}

// moveLegacyAgentBundle moves the agents' bundle out of DIR/manifests, where konnect wrote it before, to
// agentDir. The directory moves whole, so that files a user added (a kustomize patch) come along, and init
// then rewrites its own files there as it did in the old place (keeping what the user added to
// kustomization.yaml). If both exist, the old one stays and is named.
// It returns where the earlier bundle is now: agentDir, or in a dry run the old place.
func (r *runner) moveLegacyAgentBundle(agentDir string) (string, error) {
	legacy := filepath.Join(r.o.Dir, ManifestsSubdir, AgentBundleDir)
	if fi, err := os.Lstat(legacy); err != nil || !fi.IsDir() {
		return agentDir, nil
	}
	const why = "kubelet logs an error for each directory in its static-pod directory"
	switch _, err := os.Lstat(agentDir); {
	case err == nil:
		r.outcomes = append(r.outcomes, outcome{action: pki.Kept, file: legacy + string(filepath.Separator),
			note: "left by an older konnect: the bundle is now " + agentDir + "; delete this copy: " + why})
		return agentDir, nil
	case !os.IsNotExist(err):
		return "", err
	}
	r.outcomes = append(r.outcomes, outcome{action: movedTo, dryRun: r.o.DryRun, file: legacy + string(filepath.Separator),
		note: "to " + agentDir + ": " + why})
	if r.o.DryRun {
		return legacy, nil
	}
	if err := os.Rename(legacy, agentDir); err != nil {
		return "", fmt.Errorf("move the agents' bundle out of %s: %w", filepath.Dir(legacy), err)
	}
	return agentDir, nil
}

// tidyBundle compares the bundle an earlier run left in earlier with this run's files for dir. A file of
// konnect's (manifests.AgentBundleFiles, listed by the earlier kustomization.yaml, every object labelled as
// konnect's) that this run does not write is removed: a feature turned off (--server-leases, or --agent-auth
// mtls with the Secret that holds the agents' key) would otherwise leave it there. kubectl apply -k deletes
// nothing, so each object the earlier files held and this run's do not (also one that moved namespace) is
// named with the command that deletes it.
func (r *runner) tidyBundle(earlier, dir string, files []manifests.File) error {
	data, err := os.ReadFile(filepath.Join(earlier, "kustomization.yaml"))
	if err != nil {
		return nil
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if yaml.Unmarshal(data, &k) != nil {
		return nil
	}
	now := map[string]bool{}
	for _, f := range files {
		objs, err := objectsInData(f.Data, f.Name)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			now[deleteCommand(obj)] = true
		}
	}
	var gone []string
	for _, name := range k.Resources {
		if !slices.Contains(manifests.AgentBundleFiles, name) {
			continue
		}
		objs, err := objectsIn(filepath.Join(earlier, name))
		if err != nil || len(objs) == 0 || slices.ContainsFunc(objs, func(o metav1.PartialObjectMetadata) bool {
			return o.Labels[manifests.ManagedByLabel] != manifests.ManagedBy
		}) {
			continue
		}
		for _, obj := range objs {
			if cmd := deleteCommand(obj); !now[cmd] {
				gone = append(gone, cmd)
			}
		}
		if slices.ContainsFunc(files, func(f manifests.File) bool { return f.Name == name }) {
			continue
		}
		path := filepath.Join(dir, name)
		if !r.o.DryRun {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		r.outcomes = append(r.outcomes, outcome{action: removed, dryRun: r.o.DryRun, file: path, note: "no longer part of the bundle"})
	}
	for _, cmd := range gone {
		r.outcomes = append(r.outcomes, outcome{action: leftInCluster, dryRun: r.o.DryRun, file: strings.TrimPrefix(cmd, "kubectl delete "),
			note: "an earlier bundle created it and kubectl apply -k does not delete it: " + cmd})
	}
	return nil
}

// deleteCommand is the kubectl command that deletes obj.
func deleteCommand(obj metav1.PartialObjectMetadata) string {
	cmd := "kubectl delete " + strings.ToLower(obj.Kind) + " " + obj.Name
	if obj.Namespace != "" {
		cmd += " -n " + obj.Namespace
	}
	return cmd
}

// objectsIn reads the kind and metadata of every object in a YAML file of one or more documents.
func objectsIn(path string) ([]metav1.PartialObjectMetadata, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return objectsInData(data, path)
}

// objectsInData is objectsIn for data read from path.
func objectsInData(data []byte, path string) ([]metav1.PartialObjectMetadata, error) {
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

// filesDigest is the SHA-256 over the names and contents of files, for manifests.Server.FilesDigest: a file
// that does not exist yet (on a dry run) counts as empty.
func filesDigest(files []string) (string, error) {
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
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
