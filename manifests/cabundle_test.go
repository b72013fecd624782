package manifests

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const webhookStream = `# kept as it is
apiVersion: v1
kind: ConfigMap
metadata:
  name: untouched
data:
  k:    "v"   # odd spacing stays
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: pizzas
webhooks:
- name: validate.pizza.example.com   # ours
  clientConfig:
    service: {name: hook, namespace: pizza, path: /validate}
    caBundle: b2xk
  admissionReviewVersions: ["v1"]
  sideEffects: None
- name: other-service.example.com
  clientConfig:
    service: {name: hook, namespace: elsewhere}
    caBundle: b2xk
  admissionReviewVersions: ["v1"]
  sideEffects: None
- name: by-url.example.com
  clientConfig:
    url: https://hooks.example.com/validate
  admissionReviewVersions: ["v1"]
  sideEffects: None
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pizzas.restaurant.example.com
spec:
  group: restaurant.example.com
  names: {kind: Pizza, plural: pizzas}
  scope: Namespaced
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: ["v1"]
      clientConfig:
        service: {name: hook, namespace: pizza, path: /convert}
`

func TestSetCABundle(t *testing.T) {
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	out, patched, err := SetCABundle([]byte(webhookStream), ServiceRef{Name: "hook", Namespace: "pizza"}, bundle)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range patched {
		names = append(names, p.String())
	}
	if got := strings.Join(names, ","); got != "ValidatingWebhookConfiguration pizzas/validate.pizza.example.com,CustomResourceDefinition pizzas.restaurant.example.com" {
		t.Fatalf("patched %s", got)
	}
	docs := splitForTest(t, out)
	if len(docs) != 3 {
		t.Fatalf("%d documents:\n%s", len(docs), out)
	}
	// A document without a match keeps every byte.
	if !bytes.HasPrefix(out, []byte(strings.SplitN(webhookStream, "---\n", 2)[0])) {
		t.Fatalf("first document changed:\n%s", out)
	}
	var vwc admissionv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(docs[1].Body, &vwc); err != nil {
		t.Fatal(err)
	}
	want := []string{string(bundle), "old", ""}
	for i, w := range vwc.Webhooks {
		if string(w.ClientConfig.CABundle) != want[i] {
			t.Errorf("webhook %s: caBundle %q, want %q", w.Name, w.ClientConfig.CABundle, want[i])
		}
	}
	if vwc.Webhooks[0].ClientConfig.Service.Path == nil || *vwc.Webhooks[0].ClientConfig.Service.Path != "/validate" {
		t.Error("the service path was lost")
	}
	if !strings.Contains(string(docs[1].Body), "# ours") {
		t.Error("a comment in a patched document was lost")
	}
	// The CRD type lives in k8s.io/apiextensions-apiserver; its clientConfig is admission's WebhookClientConfig.
	var crd struct {
		Spec struct {
			Conversion struct {
				Webhook struct {
					ClientConfig admissionv1.WebhookClientConfig `json:"clientConfig"`
				} `json:"webhook"`
			} `json:"conversion"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(docs[2].Body, &crd); err != nil {
		t.Fatal(err)
	}
	if cc := crd.Spec.Conversion.Webhook.ClientConfig; string(cc.CABundle) != string(bundle) || cc.Service == nil || *cc.Service.Path != "/convert" {
		t.Errorf("CRD clientConfig %+v", cc)
	}

	// Setting the same bundle again is a fixed point; no match leaves the input as it was.
	checkFixedPoint(t, out, bundle)
	none, patched, err := SetCABundle([]byte(webhookStream), ServiceRef{Name: "nobody", Namespace: "pizza"}, bundle)
	if err != nil || len(patched) != 0 || string(none) != webhookStream {
		t.Fatalf("no match: %v %v", patched, err)
	}
	if _, _, err := SetCABundle([]byte("kind: [unclosed"), ServiceRef{}, nil); err == nil {
		t.Fatal("bad YAML accepted")
	}
}

func TestRenderServingSecret(t *testing.T) {
	c := ServingCerts{CA: []byte("-----BEGIN CERTIFICATE-----\nQ0E=\n-----END CERTIFICATE-----\n"),
		Cert: []byte("-----BEGIN CERTIFICATE-----\nTEVBRg==\n-----END CERTIFICATE-----\n"),
		Key:  []byte("-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n")}
	f, err := RenderServingSecret(ServiceRef{Name: "hook", Namespace: "pizza"}, c)
	if err != nil || f.Mode != secretMode || f.Name != ServingSecretFile {
		t.Fatalf("%v %v", f, err)
	}
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(f.Data, &s); err != nil {
		t.Fatal(err)
	}
	if s.Name != "hook-tls" || s.Namespace != "pizza" || s.Type != corev1.SecretTypeTLS || string(s.Data["ca.crt"]) != string(c.CA) {
		t.Fatalf("%+v", s)
	}
	if _, err := RenderServingSecret(ServiceRef{Name: "hook", Namespace: "pizza"}, ServingCerts{}); err == nil {
		t.Fatal("empty certificates accepted")
	}
}

// A file written on Windows ends its lines, and its "---" lines, with "\r\n". No document may go missing,
// the one behind a ConfigMap must be patched too, and the patched one keeps the file's line ends.
func TestSetCABundleCRLF(t *testing.T) {
	const configMap = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: untouched # kept\ndata:\n  k: v\n"
	const hooks = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: pizzas\nwebhooks:\n- name: validate.pizza.example.com # ours\n  clientConfig:\n    service: {name: hook, namespace: pizza}\n  admissionReviewVersions: [\"v1\"]\n  sideEffects: None\n"
	crlf := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	for _, order := range [][]string{{hooks, configMap}, {configMap, hooks}} {
		in := crlf(order[0] + "---\n" + order[1])
		out, patched, err := SetCABundle([]byte(in), ServiceRef{Name: "hook", Namespace: "pizza"}, bundle)
		if err != nil {
			t.Fatal(err)
		}
		if len(patched) != 1 || patched[0].String() != "ValidatingWebhookConfiguration pizzas/validate.pizza.example.com" {
			t.Fatalf("patched %v", patched)
		}
		if strings.Contains(strings.ReplaceAll(string(out), "\r\n", ""), "\n") {
			t.Errorf("a line ends with a bare \\n:\n%q", out)
		}
		if !strings.Contains(string(out), crlf(configMap)) {
			t.Errorf("the ConfigMap went missing or changed:\n%q", out)
		}
		docs := splitForTest(t, out)
		if len(docs) != 2 {
			t.Fatalf("%d documents:\n%q", len(docs), out)
		}
		var vwc admissionv1.ValidatingWebhookConfiguration
		body := docs[0].Body
		if order[0] != hooks {
			body = docs[1].Body
		}
		if err := yaml.UnmarshalStrict(body, &vwc); err != nil {
			t.Fatal(err)
		}
		if got := string(vwc.Webhooks[0].ClientConfig.CABundle); got != string(bundle) {
			t.Errorf("caBundle %q", got)
		}
		if !strings.Contains(string(body), "# ours\r\n") {
			t.Errorf("comment lost:\n%q", body)
		}
		checkFixedPoint(t, out, bundle)
	}
}

// A second document behind a marker that is not a "---" line of its own would be left out of the output;
// that must be an error instead.
func TestSetCABundleSecondDocumentInBody(t *testing.T) {
	for in, want := range map[string]string{
		"kind: ConfigMap\n--- {kind: ValidatingWebhookConfiguration, metadata: {name: x}}\n": "document 1: holds more than one YAML document",
		"kind: ConfigMap\n...\nkind: Secret\n":                                               "document 1: ",
	} {
		out, _, err := SetCABundle([]byte(in), ServiceRef{Name: "hook", Namespace: "pizza"}, []byte("x"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %q, %v", in, out, err)
		}
	}
}

// "kubectl get -o yaml" of several objects writes a List; the API server's lists leave out their items' kind.
const listStream = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: plain
webhooks:
- name: plain.pizza.example.com
  clientConfig:
    service: {name: hook, namespace: pizza}
  admissionReviewVersions: ["v1"]
  sideEffects: None
---
apiVersion: v1
kind: List
items:
- apiVersion: admissionregistration.k8s.io/v1
  kind: MutatingWebhookConfiguration
  metadata:
    name: listed
  webhooks:
  - name: mutate.pizza.example.com
    clientConfig:
      service: {name: hook, namespace: pizza}
    admissionReviewVersions: ["v1"]
    sideEffects: None
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: listed
- apiVersion: apiregistration.k8s.io/v1
  kind: APIService
  metadata:
    name: v1.pizza.example.com
  spec:
    service: {name: hook, namespace: pizza}
    group: pizza.example.com
    version: v1
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfigurationList
items:
- metadata:
    name: typed
  webhooks:
  - name: typed.pizza.example.com
    clientConfig:
      service: {name: hook, namespace: pizza}
    admissionReviewVersions: ["v1"]
    sideEffects: None
`

func TestSetCABundleList(t *testing.T) {
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	out, patched, err := SetCABundle([]byte(listStream), ServiceRef{Name: "hook", Namespace: "pizza"}, bundle)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range patched {
		names = append(names, p.String())
	}
	if got, want := strings.Join(names, ","), "ValidatingWebhookConfiguration plain/plain.pizza.example.com,"+
		"MutatingWebhookConfiguration listed/mutate.pizza.example.com,APIService v1.pizza.example.com,"+
		"ValidatingWebhookConfiguration typed/typed.pizza.example.com"; got != want {
		t.Fatalf("patched %s, want %s", got, want)
	}
	docs := splitForTest(t, out)
	if len(docs) != 3 {
		t.Fatalf("%d documents:\n%s", len(docs), out)
	}
	var list struct {
		Items []struct {
			Kind     string
			Webhooks []admissionv1.MutatingWebhook
			Spec     struct {
				CABundle []byte `json:"caBundle"`
			}
		}
	}
	if err := yaml.Unmarshal(docs[1].Body, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 || string(list.Items[0].Webhooks[0].ClientConfig.CABundle) != string(bundle) ||
		list.Items[1].Kind != "ConfigMap" || string(list.Items[2].Spec.CABundle) != string(bundle) {
		t.Errorf("List:\n%s", docs[1].Body)
	}
	var typed admissionv1.ValidatingWebhookConfigurationList
	if err := yaml.UnmarshalStrict(docs[2].Body, &typed); err != nil {
		t.Fatal(err)
	}
	if len(typed.Items) != 1 || string(typed.Items[0].Webhooks[0].ClientConfig.CABundle) != string(bundle) {
		t.Errorf("ValidatingWebhookConfigurationList:\n%s", docs[2].Body)
	}
}

// A CRD fetched with "kubectl get -o json" is JSON, and "kubectl apply" reads a file that starts with "{" as
// JSON: the patched file must stay JSON.
const crdJSON = `{
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "pizzas.restaurant.example.com", "labels": {"a<b": "x&y", "odd": "\u0001 \u2028 \"q\" \\ /"}},
    "spec": {
        "group": "restaurant.example.com",
        "names": {"kind": "Pizza", "plural": "pizzas"},
        "scope": "Namespaced",
        "preserveUnknownFields": false,
        "x-numbers": [443, -1.5e3, 0, null, true, "443"],
        "conversion": {
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "hook", "namespace": "pizza", "port": 443}}
            }
        }
    }
}
`

func TestSetCABundleJSON(t *testing.T) {
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	// JSON's escapes that YAML lacks: "\/", and a surrogate pair as Python's json.dumps writes an emoji.
	escapes := strings.Replace(crdJSON, `"labels": {`, `"annotations": {"docs": "https:\/\/example.com\/pizza", "icon": "\ud83c\udf55"}, "labels": {`, 1)
	for _, in := range []string{crdJSON, strings.ReplaceAll(crdJSON, `"port": 443}`, `"port": 443}, "caBundle": "b2xk"`), escapes} {
		out, patched, err := SetCABundle([]byte(in), ServiceRef{Name: "hook", Namespace: "pizza"}, bundle)
		if err != nil {
			t.Fatal(err)
		}
		if len(patched) != 1 {
			t.Fatalf("patched %v", patched)
		}
		if !json.Valid(out) {
			t.Fatalf("not JSON:\n%s", out)
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		cc := want["spec"].(map[string]any)["conversion"].(map[string]any)["webhook"].(map[string]any)["clientConfig"].(map[string]any)
		cc["caBundle"] = base64.StdEncoding.EncodeToString(bundle)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got\n%s", out)
		}
		if !strings.HasPrefix(string(out), "{\n  \"apiVersion\": \"apiextensions.k8s.io/v1\",\n  \"kind\"") {
			t.Errorf("keys out of order, or not indented with two spaces:\n%s", out)
		}
		checkFixedPoint(t, out, bundle)
	}
}

// Replacing a caBundle keeps the comments on and around the old value.
func TestSetCABundleKeepsComments(t *testing.T) {
	const pre = "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.pizza.example.com\nspec:\n  service:\n    name: hook\n    namespace: pizza\n"
	for in, want := range map[string]string{
		pre + "  caBundle: b2xk # set by konnect\n  version: v1\n":                    "  caBundle: eA== # set by konnect\n  version: v1\n",
		pre + "  # the CA\n  caBundle: b2xk\n  version: v1\n":                         "  # the CA\n  caBundle: eA==\n  version: v1\n",
		pre + "  caBundle:\n    # the CA\n    b2xk # set by konnect\n  version: v1\n": "  # the CA\n  caBundle: eA== # set by konnect\n  version: v1\n",
		pre + "  # about\n  caBundle: # set by konnect\n    # the CA\n    b2xk\n":     "  # about\n  # the CA\n  caBundle: eA== # set by konnect\n",
	} {
		out, _, err := SetCABundle([]byte(in), ServiceRef{Name: "hook", Namespace: "pizza"}, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != pre+want {
			t.Errorf("from\n%s\ngot\n%s\nwant\n%s", in, out, pre+want)
		}
	}
}

// checkFixedPoint: setting the same bundle on the output again changes no byte.
func checkFixedPoint(t *testing.T, out, bundle []byte) {
	t.Helper()
	again, _, err := SetCABundle(out, ServiceRef{Name: "hook", Namespace: "pizza"}, bundle)
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("second run changed the output: %v\n%q", err, again)
	}
}
