package extensions

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// serving issues a serving certificate for dns, valid from two hours ago until notAfter.
func serving(t *testing.T, ca *pkitest.Cert, dns string, notAfter time.Time) tls.Certificate {
	t.Helper()
	return ca.Issue(t, pkitest.Spec{CN: dns, Hosts: []string{dns}, Server: true, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter}).TLS()
}

// serve runs a TLS server on loopback with cert and returns its port.
func serve(t *testing.T, cert tls.Certificate) int32 {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

// loopbackDialer dials endpoint addresses directly.
type loopbackDialer struct{}

func (loopbackDialer) DialEndpoint(ctx context.Context, ep Endpoint) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", ep.String())
}
func (loopbackDialer) Via() string { return "loopback" }

// service returns a Service and its EndpointSlice pointing at 127.0.0.1:port (no endpoint when port is 0).
func service(ns, name string, port int32) []runtime.Object {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(port)}},
	}
	if port != 0 {
		slice.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}
	}
	return []runtime.Object{svc, slice}
}

func TestCheckCauses(t *testing.T) {
	ca, other := pkitest.NewCA(t, "test-ca"), pkitest.NewCA(t, "test-ca")
	soon := time.Now().Add(24 * time.Hour)
	good := serve(t, serving(t, ca, "good.ns.svc", soon))
	wrongName := serve(t, serving(t, ca, "other.ns.svc", soon))
	expired := serve(t, serving(t, ca, "old.ns.svc", time.Now().Add(-time.Hour)))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := int32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()

	var objs []runtime.Object
	for name, port := range map[string]int32{"good": good, "wrongname": wrongName, "old": expired, "down": closed, "empty": 0} {
		objs = append(objs, service("ns", name, port)...)
	}
	kube := fake.NewSimpleClientset(objs...)
	c := &Checker{Kube: kube, Dialer: loopbackDialer{}, Timeout: 5 * time.Second}
	svc := func(name string) *Service { return &Service{Namespace: "ns", Name: name, Port: 443} }
	for _, tc := range []struct {
		name   string
		target Target
		cause  string
		warn   bool
	}{
		{"ok", Target{Service: svc("good"), CABundle: ca.CertPEM}, "", true},
		{"unknown authority", Target{Service: svc("good"), CABundle: other.CertPEM}, CauseUnknownAuth, false},
		{"name mismatch", Target{Service: svc("wrongname"), CABundle: ca.CertPEM}, CauseNameMismatch, false},
		{"expired", Target{Service: svc("old"), CABundle: ca.CertPEM}, CauseExpired, false},
		{"refused", Target{Service: svc("down"), CABundle: ca.CertPEM}, CauseRefused, false},
		{"no endpoints", Target{Service: svc("empty"), CABundle: ca.CertPEM}, CauseNoEndpoints, false},
		{"no service", Target{Service: svc("nope"), CABundle: ca.CertPEM}, CauseServiceNotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.target.Kind, tc.target.Name = KindValidatingWebhook, "cfg/"+tc.name
			r := c.Check(context.Background(), tc.target)
			if r.Cause != tc.cause || r.OK != (tc.cause == "") {
				t.Fatalf("cause %q ok %v (%s), want %q", r.Cause, r.OK, r.Detail, tc.cause)
			}
			if tc.cause == "" && (r.LatencyMs <= 0 || r.NotAfter == nil || !r.NotAfter.Equal(soon.Truncate(time.Second))) {
				t.Errorf("latency %v notAfter %v", r.LatencyMs, r.NotAfter)
			}
			if got := len(r.Warnings) > 0; got != tc.warn {
				t.Errorf("warnings %v", r.Warnings)
			}
		})
	}
	if r := c.Check(context.Background(), Target{Kind: KindMutatingWebhook, Name: "m/url", URL: "https://example.invalid/"}); !r.Skipped || !r.OK {
		t.Errorf("URL webhook: %+v", r)
	}
}

func TestDiscover(t *testing.T) {
	bundle := []byte("-----BEGIN CERTIFICATE-----\nQ0E=\n-----END CERTIFICATE-----\n")
	kube := fake.NewSimpleClientset(
		&admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Webhooks: []admissionv1.ValidatingWebhook{
			{Name: "svc.example.com", ClientConfig: admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: "ns", Name: "hook", Port: ptr.To[int32](8443)}, CABundle: bundle}},
			{Name: "url.example.com", ClientConfig: admissionv1.WebhookClientConfig{URL: ptr.To("https://example.invalid/")}},
		}},
		&admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Webhooks: []admissionv1.MutatingWebhook{
			{Name: "m.example.com", ClientConfig: admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: "ns", Name: "hook"}}},
		}},
	)
	u := func(obj map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: obj} }
	b64 := base64.StdEncoding.EncodeToString(bundle)
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		apiServicesGVR: "APIServiceList", crdsGVR: "CustomResourceDefinitionList",
	},
		u(map[string]any{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": map[string]any{"name": "v1.local"}, "spec": map[string]any{"group": "local"}}),
		u(map[string]any{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": map[string]any{"name": "v1alpha1.wardle.example.com"},
			"spec": map[string]any{"service": map[string]any{"namespace": "wardle", "name": "api"}, "caBundle": b64}}),
		u(map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": map[string]any{"name": "pizzas.example.com"},
			"spec": map[string]any{"conversion": map[string]any{"strategy": "Webhook", "webhook": map[string]any{"clientConfig": map[string]any{
				"service": map[string]any{"namespace": "ns", "name": "hook", "port": int64(9443)}, "caBundle": b64}}}}}),
		u(map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": map[string]any{"name": "plain.example.com"},
			"spec": map[string]any{"conversion": map[string]any{"strategy": "None"}}}),
	)
	targets, err := Discover(context.Background(), kube, dyn)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tg := range targets {
		s := tg.Kind + " " + tg.Name + " "
		if tg.Service != nil {
			s += tg.Service.String()
		} else {
			s += tg.URL
		}
		s += " ca=" + strconv.FormatBool(string(tg.CABundle) == string(bundle))
		got = append(got, s)
	}
	want := []string{
		"APIService v1alpha1.wardle.example.com wardle/api:443 ca=true",
		"ValidatingWebhookConfiguration v/svc.example.com ns/hook:8443 ca=true",
		"ValidatingWebhookConfiguration v/url.example.com https://example.invalid/ ca=false",
		"MutatingWebhookConfiguration m/m.example.com ns/hook:443 ca=false",
		"CustomResourceDefinition pizzas.example.com ns/hook:9443 ca=true",
	}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("target %d: %q, want %q", i, got[i], want[i])
		}
	}
}
