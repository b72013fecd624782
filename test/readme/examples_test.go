//go:build integration

package readme

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The example manifests are what kube-apiserver takes (the webhook configuration decodes strictly into its
// type), and each is used by a README block, which TestREADME runs.
func TestExamples(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var used strings.Builder
	bs, err := blocks(string(md))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if m, _ := parseMarker(b.marker); b.lang == "sh" && m.needs == "" {
			used.WriteString(b.text)
		}
	}
	examples := filepath.Join(repoRoot, "docs", "examples")
	n := 0
	err = filepath.WalkDir(examples, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		rel, _ := filepath.Rel(repoRoot, p)
		if !strings.Contains(used.String(), rel) {
			t.Errorf("%s is used by no README block that runs", rel)
		}
		return nil
	})
	if err != nil || n == 0 {
		t.Fatalf("docs/examples: %d files, %v", n, err)
	}

	b, err := os.ReadFile(filepath.Join(examples, "pizza-webhook", "validating-webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vwc admissionv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(b, &vwc); err != nil {
		t.Fatalf("validating-webhook.yaml: %v", err)
	}
	if len(vwc.Webhooks) != 1 || vwc.Webhooks[0].ClientConfig.Service == nil || vwc.Webhooks[0].ClientConfig.Service.Name != "pizza-webhook" {
		t.Errorf("validating-webhook.yaml: %+v", vwc.Webhooks)
	}
	// The CRD type lives in k8s.io/apiextensions-apiserver, which konnect does not import: the fields that
	// matter here, strictly.
	var crd struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Group      string           `json:"group"`
			Names      map[string]any   `json:"names"`
			Scope      string           `json:"scope"`
			Versions   []map[string]any `json:"versions"`
			Conversion struct {
				Strategy string `json:"strategy"`
				Webhook  struct {
					ConversionReviewVersions []string                        `json:"conversionReviewVersions"`
					ClientConfig             admissionv1.WebhookClientConfig `json:"clientConfig"`
				} `json:"webhook"`
			} `json:"conversion"`
		} `json:"spec"`
	}
	if b, err = os.ReadFile(filepath.Join(examples, "pizza-webhook", "crd.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("crd.yaml: %v", err)
	}
	if crd.Kind != "CustomResourceDefinition" || crd.APIVersion != "apiextensions.k8s.io/v1" || crd.Spec.Conversion.Strategy != "Webhook" ||
		crd.Spec.Conversion.Webhook.ClientConfig.Service == nil || crd.Spec.Conversion.Webhook.ClientConfig.Service.Name != "pizza-webhook" {
		t.Errorf("crd.yaml: %+v", crd)
	}
}
