// Package extensions finds the extension servers kube-apiserver calls through the egress selector's cluster
// context (aggregated API servers, admission webhooks and CRD conversion webhooks referenced by a Service),
// and checks each one the way kube-apiserver would reach it: the Service, its endpoints, a dial, and a TLS
// handshake verified against that object's caBundle and the Service's DNS name. `konnect doctor extensions`
// prints the results.
//
// It does not decide how to dial: the caller gives a Dialer, through the Konnectivity socket on a
// control-plane node (TunnelDialer) or through kube-apiserver's pods/portforward from anywhere else
// (PortForwardDialer).
package extensions

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Kinds of extension servers, as the objects that register them are called.
const (
	KindAPIService        = "APIService"
	KindValidatingWebhook = "ValidatingWebhookConfiguration"
	KindMutatingWebhook   = "MutatingWebhookConfiguration"
	KindCRDConversion     = "CustomResourceDefinition"
)

// Causes of a failed check: the words an operator acts on.
const (
	CauseServiceNotFound = "service not found"
	CauseNoEndpoints     = "no endpoints"
	CauseNoAgent         = "no agent available"
	CauseRefused         = "connection refused"
	CauseDialTimeout     = "dial timeout"
	CauseUnknownAuth     = "unknown authority"
	CauseNameMismatch    = "name mismatch"
	CauseExpired         = "expired"
	CauseNoCABundle      = "no caBundle"
	CauseNotPod          = "endpoint is not a pod"
)

// ExpiryWarning is how close to its expiry a serving certificate draws a warning.
const ExpiryWarning = 30 * 24 * time.Hour

// Service is where kube-apiserver sends an extension server's requests.
type Service struct {
	Namespace, Name string
	Port            int32
}

func (s Service) String() string { return s.Namespace + "/" + s.Name + ":" + strconv.Itoa(int(s.Port)) }

// DNSName is the name kube-apiserver verifies the serving certificate against.
func (s Service) DNSName() string { return s.Name + "." + s.Namespace + ".svc" }

// Target is one extension server as one object registers it.
type Target struct {
	Kind string
	// Name is the object's name; for a webhook, CONFIGURATION/WEBHOOK.
	Name string
	// Service is nil for a webhook called by URL.
	Service  *Service
	URL      string
	CABundle []byte
}

// Result is the outcome of checking one Target.
type Result struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Service string `json:"service"`
	OK      bool   `json:"ok"`
	// Skipped marks a webhook called by URL: kube-apiserver reaches it through the controlplane context,
	// not the tunnel, and it is not checked.
	Skipped   bool       `json:"skipped,omitempty"`
	Cause     string     `json:"cause,omitempty"`
	Detail    string     `json:"detail,omitempty"`
	LatencyMs float64    `json:"latencyMs,omitempty"`
	NotAfter  *time.Time `json:"notAfter,omitempty"`
	Warnings  []string   `json:"warnings,omitempty"`
}

var (
	apiServicesGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	crdsGVR        = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// Discover lists every APIService served by a Service, every validating and mutating webhook, and every
// CRD conversion webhook, sorted by kind as listed here and then by name.
func Discover(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) ([]Target, error) {
	var out []Target
	apis, err := dyn.Resource(apiServicesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list APIServices: %w", err)
	}
	for _, a := range apis.Items {
		svc, ok, _ := unstructured.NestedMap(a.Object, "spec", "service")
		if !ok || svc == nil { // served by kube-apiserver itself
			continue
		}
		ca, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle")
		out = append(out, Target{Kind: KindAPIService, Name: a.GetName(), Service: serviceFrom(svc), CABundle: decodeBundle(ca)})
	}
	vwcs, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ValidatingWebhookConfigurations: %w", err)
	}
	for _, c := range vwcs.Items {
		for _, w := range c.Webhooks {
			out = append(out, webhookTarget(KindValidatingWebhook, c.Name+"/"+w.Name, w.ClientConfig.Service, w.ClientConfig.URL, w.ClientConfig.CABundle))
		}
	}
	mwcs, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	for _, c := range mwcs.Items {
		for _, w := range c.Webhooks {
			out = append(out, webhookTarget(KindMutatingWebhook, c.Name+"/"+w.Name, w.ClientConfig.Service, w.ClientConfig.URL, w.ClientConfig.CABundle))
		}
	}
	crds, err := dyn.Resource(crdsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CustomResourceDefinitions: %w", err)
	}
	for _, c := range crds.Items {
		if s, _, _ := unstructured.NestedString(c.Object, "spec", "conversion", "strategy"); s != "Webhook" {
			continue
		}
		cc, _, _ := unstructured.NestedMap(c.Object, "spec", "conversion", "webhook", "clientConfig")
		t := Target{Kind: KindCRDConversion, Name: c.GetName()}
		if svc, ok := cc["service"].(map[string]any); ok {
			t.Service = serviceFrom(svc)
		}
		t.URL, _ = cc["url"].(string)
		ca, _ := cc["caBundle"].(string)
		t.CABundle = decodeBundle(ca)
		out = append(out, t)
	}
	return out, nil
}

func webhookTarget(kind, name string, svc *admissionv1.ServiceReference, url *string, ca []byte) Target {
	t := Target{Kind: kind, Name: name, CABundle: ca}
	if svc != nil {
		t.Service = &Service{Namespace: svc.Namespace, Name: svc.Name, Port: portOr443(svc.Port)}
	}
	if url != nil {
		t.URL = *url
	}
	return t
}

func portOr443(p *int32) int32 {
	if p == nil || *p == 0 {
		return 443
	}
	return *p
}

// decodeBundle decodes the base64 caBundle of an unstructured object; a bad one counts as none.
func decodeBundle(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil
	}
	return b
}

// serviceFrom reads a service reference of an unstructured object; the port defaults to 443.
func serviceFrom(m map[string]any) *Service {
	s := &Service{Port: 443}
	s.Namespace, _ = m["namespace"].(string)
	s.Name, _ = m["name"].(string)
	switch p := m["port"].(type) {
	case int64:
		s.Port = int32(p)
	case float64:
		s.Port = int32(p)
	}
	return s
}

// Dialer opens a connection to an extension server's endpoint the way kube-apiserver would reach it.
type Dialer interface {
	DialEndpoint(ctx context.Context, ep Endpoint) (net.Conn, error)
	// Via says in a few words how it dials, for the report.
	Via() string
}

// Endpoint is one ready address behind a Service.
type Endpoint struct {
	IP   string
	Port int32
	// Pod is the pod behind the address, when the EndpointSlice names one.
	Pod *corev1.ObjectReference
}

func (e Endpoint) String() string { return net.JoinHostPort(e.IP, strconv.Itoa(int(e.Port))) }

// Checker checks targets.
type Checker struct {
	Kube   kubernetes.Interface
	Dialer Dialer
	// Timeout bounds each dial and handshake; kube-apiserver's webhook default is 10 s.
	Timeout time.Duration
	// MaxEndpoints is how many ready endpoints of one Service are checked; zero means 5.
	MaxEndpoints int
	// Now is the clock for the expiry checks; nil means time.Now.
	Now func() time.Time
}

// Check checks one target. A webhook called by URL is reported as skipped.
func (c *Checker) Check(ctx context.Context, t Target) Result {
	r := Result{Kind: t.Kind, Name: t.Name}
	if t.Service == nil {
		r.Skipped, r.OK = true, true
		r.Service = t.URL
		r.Detail = "called by URL through the controlplane context, not the tunnel"
		return r
	}
	r.Service = t.Service.String()
	if len(t.CABundle) == 0 {
		r.Warnings = append(r.Warnings, "no caBundle: kube-apiserver verifies the server against its own trust roots")
	}
	eps, cause, detail := c.endpoints(ctx, *t.Service)
	if cause != "" {
		r.Cause, r.Detail = cause, detail
		return r
	}
	limit := c.MaxEndpoints
	if limit <= 0 {
		limit = 5
	}
	if len(eps) > limit {
		eps = eps[:limit]
	}
	for _, ep := range eps {
		one := c.checkEndpoint(ctx, t, ep)
		if one.Cause != "" {
			r.Cause, r.Detail = one.Cause, ep.String()+": "+one.Detail
			r.NotAfter = one.NotAfter
			return r
		}
		r.Warnings = append(r.Warnings, one.Warnings...)
		if r.NotAfter == nil || (one.NotAfter != nil && one.NotAfter.Before(*r.NotAfter)) {
			r.NotAfter = one.NotAfter
		}
		if one.LatencyMs > r.LatencyMs {
			r.LatencyMs = one.LatencyMs
		}
	}
	r.OK = true
	return r
}

// endpoints resolves the Service port to the ready endpoints behind it, as kube-apiserver's endpoint
// routing does (--enable-aggregator-routing, which also applies to webhooks).
func (c *Checker) endpoints(ctx context.Context, s Service) ([]Endpoint, string, string) {
	svc, err := c.Kube.CoreV1().Services(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, CauseServiceNotFound, fmt.Sprintf("Service %s/%s does not exist", s.Namespace, s.Name)
	}
	if err != nil {
		return nil, "get service", err.Error()
	}
	var portName string
	found := false
	for _, p := range svc.Spec.Ports {
		if p.Port == s.Port {
			portName, found = p.Name, true
		}
	}
	if !found {
		return nil, CauseNoEndpoints, fmt.Sprintf("Service %s/%s has no port %d", s.Namespace, s.Name, s.Port)
	}
	slices, err := c.Kube.DiscoveryV1().EndpointSlices(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.Name})
	if err != nil {
		return nil, "list endpointslices", err.Error()
	}
	var eps []Endpoint
	for _, sl := range slices.Items {
		var port int32
		for _, p := range sl.Ports {
			if p.Port != nil && (p.Name == nil && portName == "" || p.Name != nil && *p.Name == portName) {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range sl.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				eps = append(eps, Endpoint{IP: a, Port: port, Pod: e.TargetRef})
			}
		}
	}
	if len(eps) == 0 {
		return nil, CauseNoEndpoints, fmt.Sprintf("Service %s/%s has no ready endpoint for port %d", s.Namespace, s.Name, s.Port)
	}
	return eps, "", ""
}

func (c *Checker) checkEndpoint(ctx context.Context, t Target, ep Endpoint) Result {
	var r Result
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	conn, err := c.Dialer.DialEndpoint(ctx, ep)
	if err != nil {
		r.Cause, r.Detail = DialCause(ctx, err), err.Error()
		if r.Cause == "" {
			r.Cause = "dial failed"
		}
		return r
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Verification is done below, by hand, so that the cause can be told apart.
	tc := tls.Client(conn, &tls.Config{ServerName: t.Service.DNSName(), InsecureSkipVerify: true}) //nolint:gosec // verified below
	if err := tc.HandshakeContext(ctx); err != nil {
		r.Cause, r.Detail = DialCause(ctx, err), "TLS handshake: "+err.Error()
		if r.Cause == "" {
			r.Cause = "TLS handshake failed"
		}
		return r
	}
	r.LatencyMs = float64(time.Since(start).Microseconds()) / 1000
	chain := tc.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		r.Cause, r.Detail = "TLS handshake failed", "the server sent no certificate"
		return r
	}
	leaf := chain[0]
	na := leaf.NotAfter
	r.NotAfter = &na
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	r.Cause, r.Detail = verify(chain, t.CABundle, t.Service.DNSName(), now)
	if r.Cause == "" && na.Sub(now) < ExpiryWarning {
		r.Warnings = append(r.Warnings, fmt.Sprintf("serving certificate expires in %s", na.Sub(now).Round(time.Hour)))
	}
	return r
}

// verify checks the chain as kube-apiserver does: against the caBundle (or the system roots without one),
// for the Service's DNS name.
func verify(chain []*x509.Certificate, caBundle []byte, dnsName string, now time.Time) (cause, detail string) {
	var roots *x509.CertPool
	if len(caBundle) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caBundle) {
			return CauseNoCABundle, "the caBundle holds no PEM certificate"
		}
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: dnsName, CurrentTime: now})
	if err == nil {
		return "", ""
	}
	var invalid x509.CertificateInvalidError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return CauseExpired, err.Error()
	case errors.As(err, &unknown):
		return CauseUnknownAuth, err.Error()
	case errors.As(err, &host):
		return CauseNameMismatch, err.Error()
	}
	return "certificate rejected", err.Error()
}
