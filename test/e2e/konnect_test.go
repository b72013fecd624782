//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/konnect-dev/konnect/test/harness"
	"sigs.k8s.io/yaml"
)

// manifestDoc is one YAML document that konnect init wrote under
// DIR/manifests or DIR/konnectivity-agent.
type manifestDoc struct {
	file string
	kind string
	name string
	raw  []byte
}

// manifestRoots are the directories of konnect init's manifests: the static pod's and the agents' bundle.
func (c *cluster) manifestRoots() []string {
	return []string{filepath.Join(c.konnectDir, "manifests"), filepath.Join(c.konnectDir, "konnectivity-agent")}
}

// konnectManifests reads every document of every YAML file under the manifest roots.
func (c *cluster) konnectManifests() ([]manifestDoc, error) {
	var docs []manifestDoc
	for _, root := range c.manifestRoots() {
		if err := readManifestDocs(root, &docs); err != nil {
			return nil, fmt.Errorf("konnect init manifests: %w", err)
		}
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("konnect init wrote no manifests under %s", c.manifestRoots())
	}
	return docs, nil
}

// readManifestDocs appends every document of every YAML file under root.
func readManifestDocs(root string, docs *[]manifestDoc) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, raw := range strings.Split(string(b), "\n---") {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(raw), &meta); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if meta.Kind != "" {
				*docs = append(*docs, manifestDoc{file: path, kind: meta.Kind, name: meta.Metadata.Name, raw: []byte(raw)})
			}
		}
		return nil
	})
}

// rbacKinds are the objects a cluster needs before any agent connects.
var rbacKinds = map[string]bool{"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true}

// konnectRBACFile collects the ServiceAccount and RBAC documents konnect
// init wrote into one file for kubectl apply -f.
func (c *cluster) konnectRBACFile() (string, []manifestDoc, error) {
	docs, err := c.konnectManifests()
	if err != nil {
		return "", nil, err
	}
	var picked []manifestDoc
	var parts []string
	for _, d := range docs {
		if rbacKinds[d.kind] {
			picked = append(picked, d)
			parts = append(parts, string(d.raw))
		}
	}
	if len(picked) == 0 {
		return "", nil, fmt.Errorf("konnect init wrote no ServiceAccount or RBAC under %s", c.manifestRoots())
	}
	path := filepath.Join(c.dir, "konnect-rbac.yaml")
	return path, picked, os.WriteFile(path, []byte(strings.Join(parts, "\n---\n")), 0o644)
}

// applyKonnectRBAC applies the agents' ServiceAccount and the server's
// TokenReview permission as konnect init generated them.
func (c *cluster) applyKonnectRBAC(ctx context.Context) error {
	path, _, err := c.konnectRBACFile()
	if err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, nsCP, "apply", "-f", path); err != nil {
		return fmt.Errorf("konnect RBAC: %w", err)
	}
	return nil
}

// konnectCertsAPIService makes sample-apiserver's serving cert, Secret,
// APIServices (both versions it serves) and RBAC with konnect certs apiservice, applies them with
// kubectl apply -k, and returns the serving cert and key files.
func (c *cluster) konnectCertsAPIService(ctx context.Context) (certFile, keyFile string, err error) {
	out := filepath.Join(c.dir, "wardle")
	if o, err := harness.Run(ctx, "", bins.konnect, "certs", "apiservice",
		"--service=api", "--namespace=wardle", "--group=wardle.example.com", "--version=v1alpha1,v1beta1",
		"--out="+out); err != nil {
		return "", "", fmt.Errorf("konnect certs apiservice: %w\n%s", err, o)
	}
	if _, err := c.kubectl(ctx, nsCP, "apply", "-k", out); err != nil {
		return "", "", fmt.Errorf("apply konnect certs apiservice output: %w", err)
	}
	return filepath.Join(out, "pki", "tls.crt"), filepath.Join(out, "pki", "tls.key"), nil
}
