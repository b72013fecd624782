package manifests

import (
	"bytes"
	"encoding/base64"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/pki/pkitest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// testPEM returns a self-signed CA certificate and its key, in PEM.
func testPEM(t *testing.T, cn string) (cert, key []byte) {
	ca := pkitest.NewCA(t, cn)
	return ca.CertPEM, ca.KeyPEM
}

func TestAgentManifests(t *testing.T) {
	ca, _ := testPEM(t, "konnectivity-ca")
	tests := []struct {
		name      string
		agent     Agent
		files     []string
		configMap string
	}{
		{
			name:      "cluster CA from kube-root-ca.crt",
			agent:     Agent{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1"},
			files:     []string{"konnectivity-agent-serviceaccount.yaml", "konnectivity-server-clusterrole.yaml", "konnectivity-server-rbac.yaml", "konnectivity-agent.yaml", "kustomization.yaml"},
			configMap: "kube-root-ca.crt",
		},
		{
			name:      "own CA ConfigMap",
			agent:     Agent{Image: "registry.example/konnect@sha256:0123", ProxyServerHost: "konnectivity.example.com,10.0.0.2:8132,[fd00::1]:8132", ProxyServerPort: 443, CACert: ca},
			files:     []string{"konnectivity-agent-ca.yaml", "konnectivity-agent-serviceaccount.yaml", "konnectivity-server-clusterrole.yaml", "konnectivity-server-rbac.yaml", "konnectivity-agent.yaml", "kustomization.yaml"},
			configMap: "konnectivity-agent-ca",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files, err := tc.agent.Render()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range files {
				names = append(names, f.Name)
				if f.Mode != 0o644 {
					t.Errorf("%s mode %v", f.Name, f.Mode)
				}
				if f.Name != "kustomization.yaml" {
					decode(t, f)
				}
			}
			if !slices.Equal(names, tc.files) {
				t.Fatalf("files %q, want %q", names, tc.files)
			}
			checkKustomization(t, files)
			if n, ran := kustomize(t, files); ran && n != len(files)-1 {
				t.Errorf("kubectl kustomize emitted %d objects, want %d", n, len(files)-1)
			}

			sa := decode(t, byName(t, files, "konnectivity-agent-serviceaccount.yaml")).(*corev1.ServiceAccount)
			if sa.Name != "konnectivity-agent" || sa.Namespace != "kube-system" {
				t.Errorf("ServiceAccount %s/%s", sa.Namespace, sa.Name)
			}
			cr := decode(t, byName(t, files, "konnectivity-server-clusterrole.yaml")).(*rbacv1.ClusterRole)
			if want := []rbacv1.PolicyRule{
				{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
			}; cr.Name != "konnectivity-server-tokenreview" || !reflect.DeepEqual(cr.Rules, want) {
				t.Errorf("ClusterRole %+v, want only create on tokenreviews and get on nodes", cr)
			}
			crb := decode(t, byName(t, files, "konnectivity-server-rbac.yaml")).(*rbacv1.ClusterRoleBinding)
			if crb.Name != "konnectivity-server-tokenreview" || crb.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "konnectivity-server-tokenreview"}) ||
				!slices.Equal(crb.Subjects, []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "system:konnectivity-server"}}) {
				t.Errorf("ClusterRoleBinding %+v", crb)
			}
			if len(tc.agent.CACert) > 0 {
				cm := decode(t, byName(t, files, "konnectivity-agent-ca.yaml")).(*corev1.ConfigMap)
				if cm.Name != "konnectivity-agent-ca" || cm.Namespace != "kube-system" || cm.Data["ca.crt"] != string(ca) {
					t.Errorf("CA ConfigMap %+v", cm)
				}
			}

			ds := decode(t, byName(t, files, "konnectivity-agent.yaml")).(*appsv1.DaemonSet)
			checkAgentDaemonSet(t, ds, tc.agent.withDefaults(), tc.configMap)
		})
	}
}

func checkAgentDaemonSet(t *testing.T, ds *appsv1.DaemonSet, a Agent, configMap string) {
	t.Helper()
	if ds.Name != "konnectivity-agent" || ds.Namespace != "kube-system" {
		t.Errorf("DaemonSet %s/%s", ds.Namespace, ds.Name)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["k8s-app"] != "konnectivity-agent" ||
		ds.Spec.Template.Labels["k8s-app"] != "konnectivity-agent" {
		t.Errorf("selector %+v does not match template labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != "konnectivity-agent" || spec.PriorityClassName != "system-node-critical" || spec.HostNetwork {
		t.Errorf("serviceAccountName %q priorityClassName %q hostNetwork %v", spec.ServiceAccountName, spec.PriorityClassName, spec.HostNetwork)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the default service-account token is mounted; the agent needs only the projected one")
	}
	wantTolerations := []corev1.Toleration{
		{Key: "node-role.kubernetes.io/control-plane", Operator: "Exists", Effect: "NoSchedule"},
		{Key: "CriticalAddonsOnly", Operator: "Exists"},
		{Operator: "Exists", Effect: "NoSchedule"},
		{Operator: "Exists", Effect: "NoExecute"},
	}
	if !slices.EqualFunc(spec.Tolerations, wantTolerations, func(a, b corev1.Toleration) bool { return a.MatchToleration(&b) }) {
		t.Errorf("tolerations %+v", spec.Tolerations)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65534 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != a.Image || !slices.Equal(c.Command, []string{"/usr/local/bin/konnect"}) {
		t.Errorf("image %q command %q", c.Image, c.Command)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container securityContext %+v", sc)
	}

	args := map[string]string{}
	for _, arg := range c.Args[1:] {
		k, v, ok := strings.Cut(arg, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Errorf("argument %q is not --name=value", arg)
		}
		args[k] = v
	}
	if c.Args[0] != "agent" || args["--proxy-server-host"] != a.ProxyServerHost || args["--proxy-server-port"] != strconv.Itoa(a.ProxyServerPort) ||
		args["--health-server-port"] != "8093" || args["--health-server-host"] != "$(POD_IP)" ||
		args["--agent-identifiers"] != "host=$(NODE_IP)" {
		t.Errorf("args %q", c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
			t.Errorf("env %s is not from a field", e.Name)
			continue
		}
		env[e.Name] = e.ValueFrom.FieldRef.FieldPath
	}
	// POD_IP for --health-server-host, NODE_IP for the server's destHost strategy.
	if want := map[string]string{"POD_IP": "status.podIP", "NODE_IP": "status.hostIP"}; !maps.Equal(env, want) {
		t.Errorf("env %v, want %v", env, want)
	}
	// Surge, never unavailable: a node's new agent connects before its old one drains.
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
		ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxUnavailable.Type != intstr.Int ||
		ru.MaxSurge == nil || ru.MaxSurge.String() == "0" || ru.MaxSurge.String() == "0%" {
		t.Errorf("update strategy %+v, want a rolling update with maxSurge and maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
	if spec.HostNetwork || len(c.Ports) > 0 && c.Ports[0].HostPort != 0 {
		t.Errorf("hostNetwork or hostPort: a surge pod would collide with the old one on the node")
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/livez"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "health" {
			t.Errorf("probe for %s: %+v", p.path, p.probe)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "health" || c.Ports[0].ContainerPort != 8093 {
		t.Errorf("ports %+v, want health 8093", c.Ports)
	}

	// The token and CA files the arguments name are the ones the projected volume provides.
	if len(c.VolumeMounts) != 1 || len(spec.Volumes) != 1 || c.VolumeMounts[0].Name != spec.Volumes[0].Name || !c.VolumeMounts[0].ReadOnly {
		t.Fatalf("mounts %+v volumes %+v", c.VolumeMounts, spec.Volumes)
	}
	dir := c.VolumeMounts[0].MountPath
	proj := spec.Volumes[0].Projected
	if proj == nil || len(proj.Sources) != 2 {
		t.Fatalf("volume %+v, want a projected volume with a CA and a token or a certificate", spec.Volumes[0])
	}
	var cm *corev1.ConfigMapProjection
	if len(a.ClientCert) == 0 {
		tok := proj.Sources[0].ServiceAccountToken
		if tok == nil || tok.Audience != "system:konnectivity-server" || tok.ExpirationSeconds == nil || *tok.ExpirationSeconds < 600 {
			t.Fatalf("token projection %+v, want audience system:konnectivity-server", tok)
		}
		if args["--service-account-token-path"] != dir+"/"+tok.Path {
			t.Errorf("--service-account-token-path=%s, but the token is at %s/%s", args["--service-account-token-path"], dir, tok.Path)
		}
		for _, flag := range []string{"--agent-cert", "--agent-key"} {
			if _, ok := args[flag]; ok {
				t.Errorf("%s with token authentication", flag)
			}
		}
		cm = proj.Sources[1].ConfigMap
	} else {
		checkAgentCertificateVolume(t, spec, proj, dir, args)
		cm = proj.Sources[0].ConfigMap
	}
	if cm == nil || cm.Name != configMap || len(cm.Items) != 1 || cm.Items[0].Key != "ca.crt" {
		t.Fatalf("CA projection %+v, want ca.crt of ConfigMap %s", cm, configMap)
	}
	if args["--ca-cert"] != dir+"/"+cm.Items[0].Path {
		t.Errorf("--ca-cert=%s, but the CA is at %s/%s", args["--ca-cert"], dir, cm.Items[0].Path)
	}
}

func TestAgentRefusesBadInput(t *testing.T) {
	agentCert, agentKey := testPEM(t, "konnectivity-agent")
	_, otherKey := testPEM(t, "other")
	tests := []struct {
		name string
		a    Agent
		want string
	}{
		{"no host", Agent{Image: "i"}, "--proxy-server-host"},
		{"bad host", Agent{Image: "i", ProxyServerHost: "https://cp:8132"}, "--proxy-server-host"},
		{"bad port", Agent{Image: "i", ProxyServerHost: "cp", ProxyServerPort: -1}, "--proxy-server-port"},
		{"no image", Agent{ProxyServerHost: "cp"}, "image"},
		{"CA not PEM", Agent{Image: "i", ProxyServerHost: "cp", CACert: []byte("not a certificate")}, "PEM"},
		{"bad entry in a list", Agent{Image: "i", ProxyServerHost: "10.0.0.1,bad_host"}, "bad_host"},
		{"bad port in a list", Agent{Image: "i", ProxyServerHost: "10.0.0.1:8132,10.0.0.2:99999"}, "port"},
		{"unspecified address", Agent{Image: "i", ProxyServerHost: "0.0.0.0"}, "--proxy-server-host: 0.0.0.0 is the unspecified address"},
		{"unspecified IPv6 address with a port", Agent{Image: "i", ProxyServerHost: "10.0.0.1,[::]:8132"}, "--proxy-server-host: :: is the unspecified address"},
		{"multicast address", Agent{Image: "i", ProxyServerHost: "ff02::1"}, "--proxy-server-host: ff02::1 is a multicast address"},
		{"broadcast address", Agent{Image: "i", ProxyServerHost: "255.255.255.255"}, "--proxy-server-host: 255.255.255.255 is the broadcast address"},
		{"mapped unspecified address", Agent{Image: "i", ProxyServerHost: "::ffff:0.0.0.0"}, "--proxy-server-host"},
		{"relative binary", Agent{Image: "i", ProxyServerHost: "cp", Binary: "konnect"}, "binary"},
		{"certificate without key", Agent{Image: "i", ProxyServerHost: "cp", ClientCert: agentCert}, "--agent-key"},
		{"key without certificate", Agent{Image: "i", ProxyServerHost: "cp", ClientKey: agentKey}, "--agent-cert"},
		{"key of another certificate", Agent{Image: "i", ProxyServerHost: "cp", ClientCert: agentCert, ClientKey: otherKey}, "--agent-cert and --agent-key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.a.Render(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render() error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// checkAgentCertificateVolume checks the client-certificate variant: the certificate and key come from
// the TLS Secret, readable by the agent's group only, and no service-account token is anywhere.
func checkAgentCertificateVolume(t *testing.T, spec corev1.PodSpec, proj *corev1.ProjectedVolumeSource, dir string, args map[string]string) {
	t.Helper()
	for _, src := range proj.Sources {
		if src.ServiceAccountToken != nil {
			t.Errorf("a service-account token is projected with client-certificate authentication: %+v", src.ServiceAccountToken)
		}
	}
	if _, ok := args["--service-account-token-path"]; ok {
		t.Errorf("--service-account-token-path with client-certificate authentication")
	}
	sec := proj.Sources[1].Secret
	if sec == nil || sec.Name != "konnectivity-agent-tls" || len(sec.Items) != 2 {
		t.Fatalf("certificate projection %+v, want tls.crt and tls.key of Secret konnectivity-agent-tls", sec)
	}
	paths := map[string]corev1.KeyToPath{}
	for _, it := range sec.Items {
		paths[it.Key] = it
	}
	if got := args["--agent-cert"]; got != dir+"/"+paths["tls.crt"].Path || paths["tls.crt"].Path == "" {
		t.Errorf("--agent-cert=%s, but tls.crt is at %s/%s", got, dir, paths["tls.crt"].Path)
	}
	key := paths["tls.key"]
	if got := args["--agent-key"]; got != dir+"/"+key.Path || key.Path == "" {
		t.Errorf("--agent-key=%s, but tls.key is at %s/%s", got, dir, key.Path)
	}
	if key.Mode == nil || *key.Mode&0o007 != 0 {
		t.Errorf("tls.key item mode %v: readable by others", key.Mode)
	}
	// kubelet makes the files root-owned; the non-root agent reads the key through the pod's fsGroup.
	psc := spec.SecurityContext
	if psc == nil || psc.FSGroup == nil || psc.RunAsUser == nil || *psc.FSGroup != 65534 || key.Mode != nil && *key.Mode&0o040 == 0 {
		t.Errorf("pod securityContext %+v with key mode %v: the agent cannot read its key", psc, key.Mode)
	}
}

func TestAgentClientCertificateManifests(t *testing.T) {
	ca, _ := testPEM(t, "konnectivity-ca")
	cert, key := testPEM(t, "konnectivity-agent")
	for _, tc := range []struct {
		name      string
		agent     Agent
		files     []string
		configMap string
	}{
		{
			name:      "own CA ConfigMap",
			agent:     Agent{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1", CACert: ca, ClientCert: cert, ClientKey: key},
			files:     []string{"konnectivity-agent-ca.yaml", "konnectivity-agent-tls.yaml", "konnectivity-agent-serviceaccount.yaml", "konnectivity-agent.yaml", "kustomization.yaml"},
			configMap: "konnectivity-agent-ca",
		},
		{
			name:      "cluster CA from kube-root-ca.crt",
			agent:     Agent{Image: Image("v1.2.3"), ProxyServerHost: "cp.example.com", ClientCert: cert, ClientKey: key},
			files:     []string{"konnectivity-agent-tls.yaml", "konnectivity-agent-serviceaccount.yaml", "konnectivity-agent.yaml", "kustomization.yaml"},
			configMap: "kube-root-ca.crt",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := tc.agent.Render()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range files {
				names = append(names, f.Name)
				want := fs.FileMode(0o644)
				if f.Name == "konnectivity-agent-tls.yaml" {
					want = 0o600
				}
				if f.Mode != want {
					t.Errorf("%s mode %v, want %v", f.Name, f.Mode, want)
				}
				if f.Name != "konnectivity-agent-tls.yaml" && bytes.Contains(f.Data, []byte(base64.StdEncoding.EncodeToString(key))) {
					t.Errorf("%s holds the agent's key", f.Name)
				}
				if f.Name != "kustomization.yaml" {
					decode(t, f)
				}
			}
			if !slices.Equal(names, tc.files) {
				t.Fatalf("files %q, want %q", names, tc.files)
			}
			checkKustomization(t, files)
			if n, ran := kustomize(t, files); ran && n != len(files)-1 {
				t.Errorf("kubectl kustomize emitted %d objects, want %d", n, len(files)-1)
			}

			sec := decode(t, byName(t, files, "konnectivity-agent-tls.yaml")).(*corev1.Secret)
			if sec.Name != "konnectivity-agent-tls" || sec.Namespace != "kube-system" || sec.Type != corev1.SecretTypeTLS ||
				!bytes.Equal(sec.Data["tls.crt"], cert) || !bytes.Equal(sec.Data["tls.key"], key) || len(sec.Data) != 2 {
				t.Errorf("Secret %s/%s type %s keys %d", sec.Namespace, sec.Name, sec.Type, len(sec.Data))
			}
			ds := decode(t, byName(t, files, "konnectivity-agent.yaml")).(*appsv1.DaemonSet)
			checkAgentDaemonSet(t, ds, tc.agent.withDefaults(), tc.configMap)
		})
	}
}
