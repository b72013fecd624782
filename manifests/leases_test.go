package manifests

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// TestNoLeaseFlagsNoLeaseRBAC: without ServerLeases and LeaseController the manifests turn neither upstream
// lease flag on (the server's --enable-lease-controller, the agents' --count-server-leases), so least
// privilege means they grant nothing on coordination.k8s.io Leases either.
func TestNoLeaseFlagsNoLeaseRBAC(t *testing.T) {
	cert, key := testPEM(t, "agent")
	for _, s := range []Server{grpcServer(), tcpServer()} {
		args := s.Args()
		for _, flag := range []string{"--enable-lease-controller", "--lease-namespace", "--lease-label"} {
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, flag) }) {
				t.Errorf("server (%s) runs with %s: %q", s.Mode, flag, args)
			}
		}
		f, err := s.Render()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(f.Data), "lease") {
			t.Errorf("server pod mentions leases:\n%s", f.Data)
		}
	}
	for _, a := range []Agent{
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1"},
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ClientCert: cert, ClientKey: key},
	} {
		args := a.Args()
		for _, flag := range []string{"--count-server-leases", "--lease-namespace", "--lease-label", "--kubeconfig"} {
			if slices.ContainsFunc(args, func(s string) bool { return strings.HasPrefix(s, flag) }) {
				t.Errorf("agent runs with %s: %q", flag, args)
			}
		}
		files, err := a.Render()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.Contains(string(f.Data), "coordination.k8s.io") || strings.Contains(string(f.Data), "leases") {
				t.Errorf("%s grants or names leases:\n%s", f.Name, f.Data)
			}
		}
	}
}

// With ServerLeases the agents watch the Leases with their own kubeconfig, token and kube-apiserver's CA,
// and the bundle grants exactly the verbs upstream's lease controller and lease counter use.
func TestAgentServerLeases(t *testing.T) {
	cert, key := testPEM(t, "agent")
	for _, a := range []Agent{
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ServerLeases: true, APIServerURL: "https://198.18.0.1:6443"},
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ServerLeases: true, APIServerURL: "https://198.18.0.1:6443", ClientCert: cert, ClientKey: key},
	} {
		args := a.Args()
		for _, want := range []string{"--count-server-leases", "--lease-namespace=konnectivity-leases", "--kubeconfig=" + agentCredentialsDir + "/kubeconfig"} {
			if !slices.Contains(args, want) {
				t.Errorf("args %q lack %s", args, want)
			}
		}
		files, err := a.Render()
		if err != nil {
			t.Fatal(err)
		}
		checkKustomization(t, files)

		// The kubeconfig names the URL and files that the projected volume holds.
		cm := decode(t, byName(t, files, AgentKubeconfigConfigMap+".yaml")).(*corev1.ConfigMap)
		kc, err := clientcmd.Load([]byte(cm.Data["kubeconfig"]))
		if err != nil {
			t.Fatalf("kubeconfig: %v", err)
		}
		ctx := kc.Contexts[kc.CurrentContext]
		cluster, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
		if cluster.Server != a.APIServerURL || cluster.CertificateAuthority != agentCredentialsDir+"/apiserver-ca.crt" || user.TokenFile != agentCredentialsDir+"/apiserver-token" {
			t.Errorf("kubeconfig: server %q, CA %q, token file %q", cluster.Server, cluster.CertificateAuthority, user.TokenFile)
		}
		ds, err := a.DaemonSet()
		if err != nil {
			t.Fatal(err)
		}
		paths := map[string]bool{}
		for _, src := range ds.Spec.Template.Spec.Volumes[0].Projected.Sources {
			switch {
			case src.ServiceAccountToken != nil:
				paths[src.ServiceAccountToken.Path] = true
				if src.ServiceAccountToken.Path == "apiserver-token" && src.ServiceAccountToken.Audience != "" {
					t.Errorf("the API token has audience %q; kube-apiserver's own (empty) is wanted", src.ServiceAccountToken.Audience)
				}
			case src.ConfigMap != nil:
				for _, item := range src.ConfigMap.Items {
					paths[item.Path] = true
					if item.Path == "apiserver-ca.crt" && src.ConfigMap.Name != rootCAConfigMap {
						t.Errorf("kube-apiserver's CA comes from %s, want %s", src.ConfigMap.Name, rootCAConfigMap)
					}
				}
			}
		}
		for _, p := range []string{"kubeconfig", "apiserver-ca.crt", "apiserver-token"} {
			if !paths[p] {
				t.Errorf("the projected volume has no %s: %v", p, paths)
			}
		}
		if a.clientCertAuth() && paths["token"] {
			t.Errorf("with client certificates the agent still gets a token for the server")
		}

		verbs := map[string][]string{}
		subjects := map[string]rbacv1.Subject{}
		for _, name := range []string{"konnectivity-server-leases", "konnectivity-agent-leases"} {
			role := decode(t, byName(t, files, name+"-role.yaml")).(*rbacv1.Role)
			binding := decode(t, byName(t, files, name+"-rolebinding.yaml")).(*rbacv1.RoleBinding)
			// Not kube-system: there the server's verbs would reach the control plane's leader-election Leases.
			if role.Namespace != "konnectivity-leases" || binding.Namespace != role.Namespace || binding.RoleRef.Name != name || len(role.Rules) != 1 ||
				!slices.Equal(role.Rules[0].APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(role.Rules[0].Resources, []string{"leases"}) {
				t.Errorf("%s: %+v %+v", name, role, binding)
			}
			verbs[name], subjects[name] = role.Rules[0].Verbs, binding.Subjects[0]
		}
		if !slices.Equal(verbs["konnectivity-server-leases"], []string{"get", "list", "create", "update", "delete"}) || subjects["konnectivity-server-leases"].Name != ServerUser {
			t.Errorf("server leases: %v for %+v", verbs["konnectivity-server-leases"], subjects["konnectivity-server-leases"])
		}
		if ns := decode(t, byName(t, files, "konnectivity-leases-namespace.yaml")).(*corev1.Namespace); ns.Name != "konnectivity-leases" {
			t.Errorf("the bundle creates namespace %q for the Leases", ns.Name)
		}
		if s := subjects["konnectivity-agent-leases"]; !slices.Equal(verbs["konnectivity-agent-leases"], []string{"list", "watch"}) || s.Name != AgentServiceAccount || s.Namespace != Namespace {
			t.Errorf("agent leases: %v for %+v", verbs["konnectivity-agent-leases"], subjects["konnectivity-agent-leases"])
		}
	}

	for url, want := range map[string]string{
		"":                         "https://HOST",
		"http://198.18.0.1:6443":   "https://HOST",
		"https://127.0.0.1:6443":   "127.0.0.1 is each agent's own node",
		"https://localhost:6443":   "localhost is each agent's own node",
		"https://[::1]:6443":       "::1 is each agent's own node",
		"https://198.18.0.1:6443/": "",
	} {
		a := Agent{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ServerLeases: true, APIServerURL: url}
		err := a.Validate()
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("APIServerURL %q: %v, want an error containing %q", url, err, want)
		}
	}
}

// The server's lease controller needs its kubeconfig, also when agents authenticate with certificates.
func TestServerLeaseController(t *testing.T) {
	for _, s := range []Server{grpcServer(), tcpServer()} {
		s.LeaseController = true
		args := s.Args()
		if !slices.Contains(args, "--enable-lease-controller") || !slices.Contains(args, "--lease-namespace=konnectivity-leases") || !slices.Contains(args, "--kubeconfig="+s.Kubeconfig) {
			t.Errorf("args %q", args)
		}
		mtls := s
		mtls.AgentClientCA = "/etc/kubernetes/pki/ca.crt"
		if err := mtls.Validate(); err != nil {
			t.Errorf("lease controller with client-certificate agents: %v", err)
		}
		if args := mtls.Args(); !slices.Contains(args, "--kubeconfig="+s.Kubeconfig) || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--agent-service-account") }) {
			t.Errorf("mTLS args %q: want --kubeconfig for the leases and no token review", args)
		}
		mtls.Kubeconfig = ""
		if err := mtls.Validate(); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
			t.Errorf("lease controller without a kubeconfig: %v", err)
		}
	}
}

// TestAgentBundleFiles: AgentBundleFiles names every file of every variant, so that a later run can tell
// konnect's files from the user's.
func TestAgentBundleFiles(t *testing.T) {
	cert, key := testPEM(t, "agent")
	ca, _ := testPEM(t, "ca")
	seen := map[string]bool{}
	for _, a := range []Agent{
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", CACert: ca},
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", CACert: ca, ClientCert: cert, ClientKey: key, ServerLeases: true, APIServerURL: "https://198.18.0.1:6443"},
		{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", ServerLeases: true, APIServerURL: "https://198.18.0.1:6443"},
	} {
		files, err := a.Render()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if f.Name == "kustomization.yaml" {
				continue
			}
			seen[f.Name] = true
			if !slices.Contains(AgentBundleFiles, f.Name) {
				t.Errorf("%s is not in AgentBundleFiles", f.Name)
			}
		}
	}
	for _, name := range AgentBundleFiles {
		if !seen[name] {
			t.Errorf("AgentBundleFiles names %s, which no variant renders", name)
		}
	}
}
