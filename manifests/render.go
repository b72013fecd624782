package manifests

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/address"
	"sigs.k8s.io/yaml"
)

// File is one rendered manifest.
type File struct {
	// Name is the file name, relative to the directory the file set belongs in.
	Name string
	Data []byte
	// Mode is 0644, or 0600 for a file that holds a private key.
	Mode fs.FileMode
}

const (
	publicMode fs.FileMode = 0o644
	secretMode fs.FileMode = 0o600
)

// ImageRepository is where konnect's container image is published.
const ImageRepository = "ghcr.io/konnect-dev/konnect"

// Image returns konnect's image reference for version, e.g. ghcr.io/konnect-dev/konnect:v0.1.0.
func Image(version string) string { return ImageRepository + ":" + version }

// DefaultBinary is the path of the konnect binary inside the image.
const DefaultBinary = "/usr/local/bin/konnect"

// Names shared by the server, the agents and kube-apiserver (held in package konnectivity, and the
// certificates' common names in pki).
const (
	// Namespace holds the agents, their ServiceAccount and the server's static pod.
	Namespace = konnectivity.Namespace
	// AgentServiceAccount is the ServiceAccount whose tokens the server accepts from agents.
	AgentServiceAccount = konnectivity.AgentServiceAccount
	// Audience is the audience of the agents' tokens, which the server's TokenReviews name.
	Audience = konnectivity.Audience
	// ServerUser is the user name (certificate CN) the server authenticates to kube-apiserver as.
	ServerUser = pki.ServerUser
	// ServerTokenReviewRole is the ClusterRole that lets ServerUser create TokenReviews and get Nodes, and
	// nothing more.
	ServerTokenReviewRole = "konnectivity-server-tokenreview"
)

// Default ports: the server's are those the Kubernetes documentation uses, the agent's are upstream
// proxy-agent's defaults.
const (
	DefaultAgentPort        = konnectivity.AgentPort
	DefaultAdminPort        = konnectivity.AdminPort
	DefaultHealthPort       = konnectivity.HealthPort
	DefaultAgentHealthPort  = konnectivity.AgentHealthPort
	DefaultFrontendPort     = konnectivity.FrontendPort
	defaultKustomizationAPI = "kustomize.config.k8s.io/v1beta1"
)

// ManagedByLabel and ManagedBy mark every object konnect renders, so that `kubectl get -l` finds them.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "konnect"
)

// commonLabels are ManagedBy and extra.
func commonLabels(extra map[string]string) map[string]string {
	l := map[string]string{ManagedByLabel: ManagedBy}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

// marshal renders obj as YAML without its status: rendered objects are desired state, and an empty
// status block (with zero counters, for a DaemonSet) only adds noise to every `kubectl apply`.
func marshal(obj any) ([]byte, error) {
	j, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, err
	}
	delete(m, "status")
	return yaml.Marshal(m)
}

// kustomization renders a kustomization.yaml that lists the files called names, in order.
func kustomization(names []string) (File, error) {
	data, err := yaml.Marshal(struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}{defaultKustomizationAPI, "Kustomization", names})
	if err != nil {
		return File{}, err
	}
	return File{Name: "kustomization.yaml", Data: data, Mode: publicMode}, nil
}

// KeepUserKustomization returns k, the kustomization.yaml konnect rendered for a directory of its own, with
// what a user added to the directory's earlier one (existing; nil for none) carried over: its other fields
// (a patch of the DaemonSet, say) and, after k's, the resources that are neither k's nor konnect's (owned,
// which a later run may drop). Comments are not carried over.
func KeepUserKustomization(k File, existing []byte, owned []string) (File, error) {
	var earlier, out map[string]any
	if err := yaml.Unmarshal(existing, &earlier); err != nil {
		return File{}, fmt.Errorf("the earlier kustomization.yaml: %w", err)
	}
	if err := yaml.Unmarshal(k.Data, &out); err != nil {
		return File{}, err
	}
	ours, _ := out["resources"].([]any)
	for key, v := range earlier {
		if key != "resources" {
			if _, set := out[key]; !set {
				out[key] = v
			}
			continue
		}
		theirs, ok := v.([]any)
		if !ok && v != nil {
			return File{}, fmt.Errorf("the earlier kustomization.yaml: resources is not a list")
		}
		for _, r := range theirs {
			if name, ok := r.(string); ok && (slices.Contains(owned, name) || slices.Contains(ours, any(name))) {
				continue
			}
			ours = append(ours, r)
		}
	}
	out["resources"] = ours
	data, err := yaml.Marshal(out)
	if err != nil {
		return File{}, err
	}
	k.Data = data
	return k, nil
}

// renderAll marshals each named object into a File and appends a kustomization.yaml listing them.
func renderAll(objs []namedObject) ([]File, error) {
	var files []File
	for _, o := range objs {
		docs, ok := o.obj.(documents)
		if !ok {
			docs = documents{o.obj}
		}
		var data []byte
		for i, obj := range docs {
			b, err := marshal(obj)
			if err != nil {
				return nil, fmt.Errorf("render %s: %w", o.name, err)
			}
			if i > 0 {
				data = append(data, "---\n"...)
			}
			data = append(data, b...)
		}
		mode := publicMode
		if o.secret {
			mode = secretMode
		}
		files = append(files, File{Name: o.name, Data: data, Mode: mode})
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	k, err := kustomization(names)
	if err != nil {
		return nil, fmt.Errorf("render kustomization.yaml: %w", err)
	}
	return append(files, k), nil
}

type namedObject struct {
	name   string
	obj    any // or documents, for a file of several
	secret bool
}

// documents are the objects of one multi-document file.
type documents []any

func checkPort(what string, port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%s %d: must be between 1 and 65535", what, port)
	}
	return nil
}

func checkAbs(what, path string) error {
	if path == "" {
		return fmt.Errorf("%s: a file path is required", what)
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s %q: path must be absolute", what, path)
	}
	return nil
}

// checkHost accepts an IP address or a DNS name, in any case, by pki's one validator of address flags.
func checkHost(what, host string) error {
	if host == "" {
		return fmt.Errorf("%s: a host is required", what)
	}
	if err := address.Validate(strings.ToLower(host)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// CheckImage refuses an empty image reference or one with white space.
func CheckImage(image string) error {
	if image == "" {
		return fmt.Errorf("image: an image reference is required")
	}
	if strings.ContainsAny(image, " \t\n\r") {
		return fmt.Errorf("image %q: must not contain white space", image)
	}
	return nil
}
