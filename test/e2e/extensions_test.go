//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// The webhook scenarios: pizza-webhook (test/e2e/tools/pizza-webhook) on w1's pod address serves a
// validating webhook and the conversion webhook of a two-version Pizza CRD, both referenced by the Service
// pizza/pizza-webhook, so kube-apiserver reaches them through the tunnel only.
const (
	pizzaNS        = "pizza"
	pizzaService   = "pizza-webhook"
	pizzaPort      = 9443
	pizzaGroup     = "restaurant.example.com"
	pizzaWebhook   = "validate.pizza.example.com"
	pizzasV1alpha1 = "/apis/" + pizzaGroup + "/v1alpha1/namespaces/" + pizzaNS + "/pizzas"
)

// pizzaManifests are what a user would write: the CRD (v1beta1 stored, v1alpha1 converted by the webhook)
// and the ValidatingWebhookConfiguration, both without a caBundle; konnect certs webhook sets it.
const pizzaManifests = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pizzas.restaurant.example.com
spec:
  group: restaurant.example.com
  scope: Namespaced
  names: {kind: Pizza, plural: pizzas, singular: pizza, listKind: PizzaList}
  versions:
  - name: v1alpha1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              toppings: {type: array, items: {type: string}}
  - name: v1beta1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              toppings:
                type: array
                items:
                  type: object
                  properties:
                    name: {type: string}
                    quantity: {type: integer}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: ["v1"]
      clientConfig:
        service: {name: pizza-webhook, namespace: pizza, path: /convert, port: 443}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: pizza-validation
webhooks:
- name: validate.pizza.example.com
  clientConfig:
    service: {name: pizza-webhook, namespace: pizza, path: /validate, port: 443}
  rules:
  - apiGroups: ["restaurant.example.com"]
    apiVersions: ["*"]
    operations: ["CREATE", "UPDATE"]
    resources: ["pizzas"]
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: ["v1"]
  timeoutSeconds: 10
`

// selectorlessService is a Service whose one endpoint is addr:port, as the endpoints controller would
// make it for a pod there.
func selectorlessService(ns, name, addr string, port int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  ports: [{name: https, port: 443, targetPort: %[4]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[2]s-e2e
  namespace: %[1]s
  labels: {kubernetes.io/service-name: %[2]s}
addressType: IPv4
endpoints:
- addresses: [%[3]q]
  conditions: {ready: true}
ports: [{name: https, port: %[4]d, protocol: TCP}]
`, ns, name, addr, port)
}

// pizzaServer is a pizza-webhook process on w1 with the serving certificate copied from a Secret, as
// kubelet would mount it.
type pizzaServer struct {
	p        *proc
	certsDir string
}

// syncSecret writes tls.crt and tls.key of Secret ns/name into dir, each by rename, as kubelet's atomic
// writer updates a Secret volume.
func (c *cluster) syncSecret(ctx context.Context, ns, name, dir string) error {
	out, err := c.kubectl(ctx, nsCP, "-n", ns, "get", "secret", name, "-o", "json")
	if err != nil {
		return err
	}
	var s struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []string{"tls.key", "tls.crt"} {
		tmp := filepath.Join(dir, "."+f+".tmp")
		if err := os.WriteFile(tmp, s.Data[f], 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) startPizzaServer(t *testing.T, ctx context.Context, secret string, port int) *pizzaServer {
	t.Helper()
	s := &pizzaServer{certsDir: filepath.Join(c.dir, "pizza-certs-"+strconv.Itoa(port))}
	if err := c.syncSecret(ctx, pizzaNS, secret, s.certsDir); err != nil {
		t.Fatal(err)
	}
	s.p = startProcT(t, "pizza-webhook-"+strconv.Itoa(port), c.tp.ns(nsW1), c.logDir, bins.pizzaWebhook,
		"--listen", fmt.Sprintf("%s:%d", podAddr, port),
		"--tls-cert-file", filepath.Join(s.certsDir, "tls.crt"), "--tls-private-key-file", filepath.Join(s.certsDir, "tls.key"))
	client := nsHTTPClient(c.tp.ns(nsW1), &tls.Config{InsecureSkipVerify: true}, 3*time.Second) //nolint:gosec // liveness only; kube-apiserver checks the caBundle
	if err := harness.Poll("pizza-webhook /healthz", 30*time.Second, 200*time.Millisecond, func() error {
		if err := s.p.Exited(); err != nil {
			return err
		}
		return httpGetOK(ctx, client, fmt.Sprintf("https://%s:%d/healthz", podAddr, port), nil)
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// certSerial is the serial number of the PEM certificate in file.
func certSerial(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", file)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber.Text(16)
}

// servedSerial is the serial number of the certificate a server on w1's pod address presents.
func (c *cluster) servedSerial(ctx context.Context, port int) (string, error) {
	conn, err := harness.DialIn(ctx, c.tp.ns(nsW1), fmt.Sprintf("%s:%d", podAddr, port))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the serial
	if err := tc.HandshakeContext(ctx); err != nil {
		return "", err
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.Text(16), nil
}

// doctorRow is one line of konnect doctor extensions -o json.
type doctorRow struct {
	Kind, Name, Service, Cause, Detail string
	OK, Skipped                        bool
	Warnings                           []string
}

// doctorExtensions runs konnect doctor extensions -o json in namespace role with kubeconfig and returns
// its rows by name and its exit code.
func (c *cluster) doctorExtensions(t *testing.T, ctx context.Context, role, kubeconfig string, extra ...string) (map[string]doctorRow, int) {
	t.Helper()
	argv := append([]string{"ip", "netns", "exec", c.tp.ns(role), bins.konnect, "doctor", "extensions",
		"--kubeconfig", kubeconfig, "--timeout", "4s", "-o", "json"}, extra...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("konnect doctor extensions: %v", err)
	}
	var rep struct {
		Extensions []doctorRow `json:"extensions"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("konnect doctor extensions -o json: %v\n%s", err, out)
	}
	rows := map[string]doctorRow{}
	for _, r := range rep.Extensions {
		rows[r.Name] = r
	}
	return rows, code
}

// doctorOnCP is konnect doctor extensions on the control-plane node, through the server's socket.
func (c *cluster) doctorOnCP(t *testing.T, ctx context.Context) (map[string]doctorRow, int) {
	t.Helper()
	return c.doctorExtensions(t, ctx, nsCP, c.kubeconfig, "--uds-name", c.udsName)
}

// pizzaWebhookManifest runs pizza-webhook on node with the Secret of konnect certs webhook. hostNetwork for
// the reason sample-apiserver has it: the endpoint is the node's address, which the server's destHost
// strategy routes to that node's agent.
func pizzaWebhookManifest(node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: pizza}
---
apiVersion: v1
kind: Service
metadata: {name: pizza-webhook, namespace: pizza}
spec:
  selector: {app: pizza-webhook}
  ports: [{name: https, port: 443, targetPort: %[2]d}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: pizza-webhook, namespace: pizza}
spec:
  replicas: 1
  selector: {matchLabels: {app: pizza-webhook}}
  template:
    metadata: {labels: {app: pizza-webhook}}
    spec:
      hostNetwork: true
      nodeSelector: {kubernetes.io/hostname: %[3]s}
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65534}
      containers:
      - name: pizza-webhook
        image: %[1]s
        imagePullPolicy: Never
        args: [--listen=:%[2]d, --tls-cert-file=/certs/tls.crt, --tls-private-key-file=/certs/tls.key]
        securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
        volumeMounts: [{name: certs, mountPath: /certs, readOnly: true}]
      volumes: [{name: certs, secret: {secretName: pizza-webhook-tls}}]
`, imgPizza, pizzaPort, node)
}

// checkDoctorExtensions runs pizza-webhook as a pod on w1 (its validating webhook and the Pizza CRD's
// conversion webhook working through the tunnel), then konnect doctor extensions where every extension
// server is a pod: on cp through the static pod's socket, and from lap over konnect socks, through
// pods/portforward. With no agent on any node, both name the cause; with the agents back, both are OK.
func (nc *nodeCluster) checkDoctorExtensions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := nc.applyYAML(ctx, pizzaWebhookManifest("w1")); err != nil {
		t.Fatal(err)
	}
	nc.installPizzaWebhook(t, ctx)
	if _, err := nc.kubectl(ctx, nsCP, "-n", pizzaNS, "rollout", "status", "deployment/pizza-webhook", "--timeout=120s"); err != nil {
		t.Fatal(err)
	}
	nc.checkConversion(t, ctx)
	nc.checkValidation(t, ctx)
	lapConf := nc.startLaptop(t).kubeconfig
	names := []string{apiServiceName, "pizza-validation/" + pizzaWebhook, "pizzas." + pizzaGroup}
	where := []struct {
		name string
		run  func() (map[string]doctorRow, int)
	}{
		{"cp, through the socket", func() (map[string]doctorRow, int) { return nc.doctorOnCP(t, ctx) }},
		{"lap, through pods/portforward", func() (map[string]doctorRow, int) { return nc.doctorExtensions(t, ctx, nsLap, lapConf) }},
	}
	expect := func(want string) {
		t.Helper()
		for _, w := range where {
			var r doctorRow
			var code int
			if err := harness.Poll(fmt.Sprintf("doctor extensions (%s) saying %q", w.name, want), 90*time.Second, 2*time.Second, func() error {
				var rows map[string]doctorRow
				rows, code = w.run()
				for _, name := range names {
					r = rows[name]
					if !((want == "OK" && r.OK && code == 0) || (want != "OK" && r.Cause == want && code == 1)) {
						return fmt.Errorf("%s: ok=%v cause=%q (%s), exit %d", name, r.OK, r.Cause, r.Detail, code)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("doctor extensions (%s): %s: %s", w.name, strings.Join(names, ", "), want)
		}
	}
	expect("OK")
	// No agent anywhere: the DaemonSet selects no node for a while.
	patch := func(selector string) {
		t.Helper()
		if _, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "patch", "daemonset", "konnectivity-agent", "--type=json",
			"-p", `[{"op":"add","path":"/spec/template/spec/nodeSelector/e2e-agents","value":"`+selector+`"}]`); err != nil {
			t.Fatal(err)
		}
	}
	restore := func() {
		_, _ = nc.kubectl(ctx, nsCP, "-n", "kube-system", "patch", "daemonset", "konnectivity-agent", "--type=json",
			"-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector/e2e-agents"}]`)
	}
	patch("none")
	t.Cleanup(restore)
	if err := harness.Poll("every agent pod gone", 2*time.Minute, time.Second, func() error {
		out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pods", "-l", "k8s-app=konnectivity-agent", "-o", "name")
		if err != nil || strings.TrimSpace(out) != "" {
			return fmt.Errorf("agent pods: %q %v", out, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	expect("no agent available")
	restore()
	if _, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "rollout", "status", "daemonset/konnectivity-agent", "--timeout=120s"); err != nil {
		t.Fatal(err)
	}
	expect("OK")
}

// TestExtensions runs an aggregated API server, a validating webhook and a CRD conversion webhook on w1,
// served through the tunnel only, with serving certificates and caBundles from konnect certs, and checks
// conversion, rejection with the webhook's own message, what happens with no agent, every cause konnect
// doctor extensions names, and a CA rotation under load with no failed request.
func TestExtensions(t *testing.T) {
	dumpLogsOnFailure(t)
	top := t // processes that outlive a subtest are started on the test itself
	c := sharedCluster(t, modeGRPCUDS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c.startServer(t, serverOpts{impl: implKonnect, id: "cp-0"})
	agents := []*tunnelAgent{c.startAgent(t, agentOpts{impl: implKonnect, role: nsW1}), c.startAgent(t, agentOpts{impl: implKonnect, role: nsW2})}
	if err := c.waitAPIService(ctx, "True", 90*time.Second); err != nil {
		t.Fatal(err)
	}

	if err := c.applyYAML(ctx, "apiVersion: v1\nkind: Namespace\nmetadata: {name: pizza}\n---\n"+selectorlessService(pizzaNS, pizzaService, podAddr, pizzaPort)); err != nil {
		t.Fatal(err)
	}
	hookDir := c.installPizzaWebhook(t, ctx)
	server := c.startPizzaServer(t, ctx, pizzaService+"-tls", pizzaPort)

	t.Run("conversion", func(t *testing.T) { c.checkConversion(t, ctx) })
	t.Run("validating-webhook-message", func(t *testing.T) { c.checkValidation(t, ctx) })

	t.Run("doctor-ok", func(t *testing.T) {
		rows, code := c.doctorOnCP(t, ctx)
		for _, name := range []string{apiServiceName, "pizza-validation/" + pizzaWebhook, "pizzas." + pizzaGroup} {
			if r, ok := rows[name]; !ok || !r.OK {
				t.Errorf("doctor extensions: %s: %+v (listed: %v)", name, r, ok)
			}
		}
		if code != 0 {
			t.Errorf("doctor extensions exit code %d with every check OK", code)
		}
	})

	t.Run("no-agent", func(t *testing.T) {
		for _, a := range agents {
			a.p.Stop(syscall.SIGTERM, 5*time.Second)
		}
		path := filepath.Join(c.dir, "quattro.yaml")
		if err := os.WriteFile(path, []byte("apiVersion: restaurant.example.com/v1alpha1\nkind: Pizza\nmetadata: {name: quattro, namespace: pizza}\nspec:\n  toppings: [cheese]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var lastErr error
		if err := harness.Poll("a create refused while no agent is connected", 30*time.Second, time.Second, func() error {
			_, lastErr = c.kubectl(ctx, nsCP, "create", "--dry-run=server", "-f", path)
			if lastErr == nil {
				return errNotYet
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(lastErr.Error(), pizzaWebhook) {
			t.Fatalf("with no agent, kube-apiserver's error does not name the webhook: %v", lastErr)
		}
		rows, code := c.doctorOnCP(t, ctx)
		if r := rows["pizza-validation/"+pizzaWebhook]; r.Cause != "no agent available" {
			t.Fatalf("doctor extensions with no agent: %+v", r)
		}
		if code != 1 {
			t.Fatalf("doctor extensions exit code %d with failures, want 1", code)
		}
		t.Logf("no agent: kubectl fails with %q; doctor names %q", tailString(lastErr.Error(), 300), rows["pizza-validation/"+pizzaWebhook].Cause)
		agents[0] = c.startAgent(top, agentOpts{impl: implKonnect, role: nsW1})
		agents[1] = c.startAgent(top, agentOpts{impl: implKonnect, role: nsW2})
		if err := harness.Poll("a create through the webhook once the agent is back", time.Minute, time.Second, func() error {
			_, err := c.kubectl(ctx, nsCP, "create", "--dry-run=server", "-f", path)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("doctor-causes", func(t *testing.T) { c.checkDoctorCauses(t, top, ctx, hookDir) })

	t.Run("rotate-ca-under-load", func(t *testing.T) { c.rotateUnderLoad(t, ctx, hookDir, server) })
}

// installPizzaWebhook runs konnect certs webhook on the user's manifests (pizzaManifests) for the Service
// pizza/pizza-webhook, applies its output with kubectl apply -k, and waits for the CRD; it returns the
// directory. The Service and the server are the caller's.
func (c *cluster) installPizzaWebhook(t *testing.T, ctx context.Context) string {
	t.Helper()
	in := filepath.Join(c.dir, "pizza-in")
	if err := os.MkdirAll(in, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in, "pizza.yaml"), []byte(pizzaManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	hookDir := filepath.Join(c.dir, "pizza-webhook")
	if out, err := harness.Run(ctx, "", bins.konnect, "certs", "webhook", "--service", pizzaService, "--namespace", pizzaNS, "--out", hookDir, filepath.Join(in, "pizza.yaml")); err != nil {
		t.Fatalf("konnect certs webhook: %v\n%s", err, out)
	}
	if _, err := c.kubectl(ctx, nsCP, "apply", "-k", hookDir); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kubectl(ctx, nsCP, "wait", "--for=condition=Established", "--timeout=60s", "crd/pizzas."+pizzaGroup); err != nil {
		t.Fatal(err)
	}
	return hookDir
}

// checkConversion creates Pizzas in one version and reads them in the other, through the conversion webhook.
func (c *cluster) checkConversion(t *testing.T, ctx context.Context) {
	t.Helper()
	// Created as v1alpha1 (a repeated topping is an extra portion), stored as v1beta1, read in both.
	if err := harness.Poll("create a v1alpha1 pizza", time.Minute, time.Second, func() error {
		return c.applyYAML(ctx, "apiVersion: restaurant.example.com/v1alpha1\nkind: Pizza\nmetadata: {name: margherita, namespace: pizza}\nspec:\n  toppings: [mozzarella, tomato, tomato]\n")
	}); err != nil {
		t.Fatal(err)
	}
	beta := c.kubectlT(t, "-n", pizzaNS, "get", "pizzas.v1beta1."+pizzaGroup, "margherita", "-o", "jsonpath={.spec.toppings}")
	if !strings.Contains(beta, `{"name":"tomato","quantity":2}`) || !strings.Contains(beta, `{"name":"mozzarella","quantity":1}`) {
		t.Fatalf("margherita read as v1beta1: %s", beta)
	}
	if err := c.applyYAML(ctx, "apiVersion: restaurant.example.com/v1beta1\nkind: Pizza\nmetadata: {name: salami, namespace: pizza}\nspec:\n  toppings: [{name: salami, quantity: 2}, {name: tomato, quantity: 1}]\n"); err != nil {
		t.Fatal(err)
	}
	alpha := c.kubectlT(t, "-n", pizzaNS, "get", "pizzas.v1alpha1."+pizzaGroup, "salami", "-o", "jsonpath={.spec.toppings}")
	if alpha != `["salami","salami","tomato"]` {
		t.Fatalf("salami read as v1alpha1: %s", alpha)
	}
	t.Logf("Pizza created as v1alpha1 reads back as v1beta1 %s; created as v1beta1 reads back as v1alpha1 %s", beta, alpha)
}

// checkValidation creates a Pizza the validating webhook refuses, and expects its own message from kubectl.
func (c *cluster) checkValidation(t *testing.T, ctx context.Context) {
	t.Helper()
	path := filepath.Join(c.dir, "hawaii.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: restaurant.example.com/v1alpha1\nkind: Pizza\nmetadata: {name: hawaii, namespace: pizza}\nspec:\n  toppings: [ham, pineapple]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.kubectl(ctx, nsCP, "create", "-f", path)
	if err == nil || !strings.Contains(err.Error(), "pineapple does not belong on a pizza") || !strings.Contains(err.Error(), pizzaWebhook) {
		t.Fatalf("kubectl create of a pineapple pizza: %v\n%s", err, out)
	}
	t.Logf("kubectl shows the webhook's own refusal: %s", tailString(err.Error(), 200))
}

// checkDoctorCauses makes each failure konnect doctor extensions names happen for real, one webhook
// configuration at a time (each selects no namespace, so kube-apiserver never calls it), and checks the
// cause.
func (c *cluster) checkDoctorCauses(t, top *testing.T, ctx context.Context, hookDir string) {
	caBundle := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	hook := func(name, service string, bundle string) string {
		return fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: %[1]s}
webhooks:
- name: %[1]s.example.com
  clientConfig:
    service: {name: %[2]s, namespace: pizza, path: /validate}
    caBundle: %[3]s
  namespaceSelector: {matchLabels: {e2e-never: "true"}}
  rules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  failurePolicy: Ignore
  sideEffects: None
  admissionReviewVersions: ["v1"]
`, name, service, b64(bundle))
	}
	// A second CA with a serving certificate valid for one second: expired by the time it is checked.
	expiredDir := filepath.Join(c.dir, "expired-webhook")
	if out, err := harness.Run(ctx, "", bins.konnect, "certs", "webhook", "--service", "expired", "--namespace", pizzaNS, "--out", expiredDir, "--cert-validity-period", "1s", "--allow-short-validity"); err != nil {
		t.Fatalf("konnect certs webhook --cert-validity-period 1s --allow-short-validity: %v\n%s", err, out)
	}
	if _, err := c.kubectl(ctx, nsCP, "apply", "-k", expiredDir); err != nil {
		t.Fatal(err)
	}
	c.startPizzaServer(top, ctx, "expired-tls", pizzaPort+1)
	// A port whose SYNs w1 drops: the dial times out.
	if out, err := harness.Run(ctx, c.tp.ns(nsW1), "iptables", "-A", "INPUT", "-p", "tcp", "--dport", strconv.Itoa(pizzaPort+3), "-j", "DROP"); err != nil {
		t.Fatalf("iptables: %v\n%s", err, out)
	}
	objs := selectorlessService(pizzaNS, "refused", podAddr, pizzaPort+2) + "---\n" +
		selectorlessService(pizzaNS, "silent", podAddr, pizzaPort+3) + "---\n" +
		selectorlessService(pizzaNS, "alias", podAddr, pizzaPort) + "---\n" +
		selectorlessService(pizzaNS, "expired", podAddr, pizzaPort+1) + "---\n" +
		"apiVersion: v1\nkind: Service\nmetadata: {name: empty, namespace: pizza}\nspec:\n  ports: [{name: https, port: 443, targetPort: 9443}]\n"
	if err := c.applyYAML(ctx, objs); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, service, bundle, cause string }{
		{"no-endpoints", "empty", caBundle(hookDir), "no endpoints"},
		{"refused", "refused", caBundle(hookDir), "connection refused"},
		{"timeout", "silent", caBundle(hookDir), "dial timeout"},
		{"unknown-authority", pizzaService, caBundle(expiredDir), "unknown authority"},
		{"name-mismatch", "alias", caBundle(hookDir), "name mismatch"},
		{"expired", "expired", caBundle(expiredDir), "expired"},
	} {
		if err := c.applyYAML(ctx, hook(tc.name, tc.service, tc.bundle)); err != nil {
			t.Fatal(err)
		}
		rows, code := c.doctorOnCP(t, ctx)
		r := rows[tc.name+"/"+tc.name+".example.com"]
		if r.Cause != tc.cause || code != 1 {
			t.Errorf("%s: doctor says %q (%s), exit %d; want %q, exit 1", tc.name, r.Cause, r.Detail, code, tc.cause)
		} else {
			t.Logf("%-17s doctor: %s", tc.name, r.Cause)
		}
		if _, err := c.kubectl(ctx, nsCP, "delete", "validatingwebhookconfiguration", tc.name); err != nil {
			t.Fatal(err)
		}
	}
	// A webhook by URL uses the controlplane context: listed as skipped, and the exit code stays 0.
	url := "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: by-url}\nwebhooks:\n" +
		"- name: by-url.example.com\n  clientConfig: {url: \"https://127.0.0.1:1/validate\"}\n  namespaceSelector: {matchLabels: {e2e-never: \"true\"}}\n" +
		"  rules: [{apiGroups: [\"\"], apiVersions: [\"v1\"], operations: [\"CREATE\"], resources: [\"configmaps\"]}]\n  failurePolicy: Ignore\n  sideEffects: None\n  admissionReviewVersions: [\"v1\"]\n"
	if err := c.applyYAML(ctx, url); err != nil {
		t.Fatal(err)
	}
	rows, code := c.doctorOnCP(t, ctx)
	if r := rows["by-url/by-url.example.com"]; !r.Skipped || code != 0 {
		t.Errorf("webhook by URL: %+v, exit %d; want skipped, exit 0", r, code)
	}
	if _, err := c.kubectl(ctx, nsCP, "delete", "validatingwebhookconfiguration", "by-url"); err != nil {
		t.Fatal(err)
	}
}

// rotateUnderLoad runs konnect certs rotate-ca through its three steps on the APIService's and the
// webhooks' directories while a request loop calls all three kinds of extension server, and requires
// that not one request fails.
func (c *cluster) rotateUnderLoad(t *testing.T, ctx context.Context, hookDir string, server *pizzaServer) {
	client, err := c.apiHTTPClient(nsCP)
	if err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("https://%s:%d", cpAddr, apiPort)
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	request := func(method, path, body string) error {
		req, err := http.NewRequestWithContext(ctx, method, api+path, strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		return nil
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Bounded: at most 20000 rounds, and it stops when the rotation is done.
		for i := 0; i < 20000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, r := range []struct{ method, path, body string }{
				{http.MethodGet, flundersPath, ""},                   // the aggregated API server
				{http.MethodGet, pizzasV1alpha1 + "/margherita", ""}, // stored as v1beta1: the conversion webhook
				{http.MethodPost, pizzasV1alpha1 + "?dryRun=All", `{"apiVersion":"restaurant.example.com/v1alpha1","kind":"Pizza","metadata":{"generateName":"load-"},"spec":{"toppings":["basil"]}}`}, // the validating webhook
			} {
				if err := request(r.method, r.path, r.body); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					ok.Add(1)
				}
			}
		}
	}()
	// waitRequests lets the loop make n more successful rounds, so that each step is exercised under load.
	waitRequests := func(n int64) {
		target := ok.Load() + 3*n
		if err := harness.Poll("requests under the new step", time.Minute, 100*time.Millisecond, func() error {
			if ok.Load() < target {
				return errNotYet
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	wardleDir := filepath.Join(c.dir, "wardle")
	waitRequests(20)
	for step := 1; step <= 3; step++ {
		for _, dir := range []string{wardleDir, hookDir} {
			if out, err := harness.Run(ctx, "", bins.konnect, "certs", "rotate-ca", "--out", dir, "--step", strconv.Itoa(step)); err != nil {
				t.Fatalf("rotate-ca --step %d --out %s: %v\n%s", step, dir, err, out)
			}
			if _, err := c.kubectl(ctx, nsCP, "apply", "-k", dir); err != nil {
				t.Fatal(err)
			}
		}
		if step == 2 {
			// The servers take the new certificate from the Secret's files: pizza-webhook from a copy of the
			// Secret written as kubelet writes it, sample-apiserver from the files konnect rotated.
			if err := c.syncSecret(ctx, pizzaNS, pizzaService+"-tls", server.certsDir); err != nil {
				t.Fatal(err)
			}
			for _, s := range []struct {
				port int
				file string
			}{{pizzaPort, filepath.Join(hookDir, "pki", "tls.crt")}, {podPort, filepath.Join(wardleDir, "pki", "tls.crt")}} {
				want := certSerial(t, s.file)
				if err := harness.Poll(fmt.Sprintf("port %d serving the certificate from the new CA", s.port), 2*time.Minute, 250*time.Millisecond, func() error {
					got, err := c.servedSerial(ctx, s.port)
					if err != nil || got != want {
						return fmt.Errorf("serial %s, want %s (%v)", got, want, err)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitRequests(20)
		t.Logf("rotate-ca step %d applied: %d requests OK, %d failed so far", step, ok.Load(), failed.Load())
	}
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed during the CA rotation; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	t.Logf("CA rotation of the APIService, the validating webhook and the conversion webhook: %d requests, 0 failed", ok.Load())
}
