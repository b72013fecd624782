package manifests

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func grpcServer() Server {
	return Server{
		Image:       Image("v1.2.3"),
		Mode:        "grpc",
		UDSName:     "/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
		ClusterCert: "/etc/kubernetes/pki/konnectivity-server.crt",
		ClusterKey:  "/etc/kubernetes/pki/konnectivity-server.key",
		Kubeconfig:  "/etc/kubernetes/konnectivity-server.conf",
	}
}

func tcpServer() Server {
	s := grpcServer()
	s.Mode, s.UDSName = "http-connect", ""
	s.ServerCert = "/etc/kubernetes/pki/konnectivity-frontend.crt"
	s.ServerKey = "/etc/kubernetes/pki/konnectivity-frontend.key"
	s.ServerCACert = "/etc/kubernetes/frontend-ca/ca.crt"
	return s
}

func renderPod(t *testing.T, s Server) *corev1.Pod {
	t.Helper()
	f, err := s.Render()
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	if f.Name != "konnectivity-server.yaml" || f.Mode != 0o600 {
		t.Errorf("file %s mode %v", f.Name, f.Mode)
	}
	pod, ok := decode(t, f).(*corev1.Pod)
	if !ok {
		t.Fatalf("konnectivity-server.yaml is not a Pod")
	}
	return pod
}

func TestServerPod(t *testing.T) {
	common := []string{
		"--cluster-cert=/etc/kubernetes/pki/konnectivity-server.crt",
		"--cluster-key=/etc/kubernetes/pki/konnectivity-server.key",
	}
	strategies := "--proxy-strategies=destHost,default"
	ports := []string{
		"--agent-port=8132",
		"--admin-port=8133",
		"--health-bind-address=127.0.0.1",
		"--health-port=8134",
	}
	tail := slices.Concat(ports, []string{
		"--agent-namespace=kube-system",
		"--agent-service-account=konnectivity-agent",
		"--kubeconfig=/etc/kubernetes/konnectivity-server.conf",
		"--authentication-audience=system:konnectivity-server",
	})
	type mount struct {
		name, path string
		t          corev1.HostPathType
		readOnly   bool
	}
	// One read-only file mount per file the server reads: never the directory, which holds the CA keys.
	file := func(name, path string) mount { return mount{name, path, corev1.HostPathFile, true} }
	clusterCert := file("cluster-cert", "/etc/kubernetes/pki/konnectivity-server.crt")
	clusterKey := file("cluster-key", "/etc/kubernetes/pki/konnectivity-server.key")
	frontend := []mount{
		file("server-cert", "/etc/kubernetes/pki/konnectivity-frontend.crt"),
		file("server-key", "/etc/kubernetes/pki/konnectivity-frontend.key"),
		file("server-ca-cert", "/etc/kubernetes/frontend-ca/ca.crt"),
	}
	kubeconfig := file("kubeconfig", "/etc/kubernetes/konnectivity-server.conf")
	uds := mount{"konnectivity-uds", "/etc/kubernetes/konnectivity-server", corev1.HostPathDirectoryOrCreate, false}
	httpUDS := grpcServer()
	httpUDS.Mode = "http-connect"
	// Agents with client certificates: upstream refuses --cluster-ca-cert next to the token flags, and
	// without TokenReview the server has no use for a kubeconfig.
	mtls := grpcServer()
	mtls.AgentClientCA, mtls.Kubeconfig = "/etc/kubernetes/pki/ca.crt", ""
	mtlsTCP := tcpServer()
	mtlsTCP.AgentClientCA, mtlsTCP.Kubeconfig = "/etc/kubernetes/agent-ca/ca.crt", ""
	// What konnect init renders for --agent-auth mtls --transport tcp: one CA for both kinds of client.
	oneCA := tcpServer()
	oneCA.ServerCACert, oneCA.AgentClientCA, oneCA.Kubeconfig = "/etc/kubernetes/pki/ca.crt", "/etc/kubernetes/pki/ca.crt", ""

	tests := []struct {
		name   string
		server Server
		args   []string
		mounts []mount
		ports  []int32
	}{
		{
			name:   "grpc over uds",
			server: grpcServer(),
			args: slices.Concat([]string{"server",
				"--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
				"--delete-existing-uds-file=true", "--server-port=0"}, common, []string{"--mode=grpc", strategies}, tail),
			mounts: []mount{uds, clusterCert, clusterKey, kubeconfig},
			ports:  []int32{8132, 8133, 8134},
		},
		{
			name:   "http-connect over uds",
			server: httpUDS,
			args: slices.Concat([]string{"server",
				"--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
				"--delete-existing-uds-file=true", "--server-port=0"}, common, []string{"--mode=http-connect", strategies}, tail),
			mounts: []mount{uds, clusterCert, clusterKey, kubeconfig},
			ports:  []int32{8132, 8133, 8134},
		},
		{
			name:   "grpc over uds in a shared directory",
			server: func() Server { s := grpcServer(); s.AllowSharedUDSDir = true; return s }(),
			args: slices.Concat([]string{"server",
				"--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
				"--delete-existing-uds-file=true", "--server-port=0", "--allow-shared-uds-dir"}, common, []string{"--mode=grpc", strategies}, tail),
			mounts: []mount{uds, clusterCert, clusterKey, kubeconfig},
			ports:  []int32{8132, 8133, 8134},
		},
		{
			name:   "http-connect over tcp",
			server: tcpServer(),
			args: slices.Concat([]string{"server",
				"--server-bind-address=127.0.0.1", "--server-port=8090",
				"--server-cert=/etc/kubernetes/pki/konnectivity-frontend.crt",
				"--server-key=/etc/kubernetes/pki/konnectivity-frontend.key",
				"--server-ca-cert=/etc/kubernetes/frontend-ca/ca.crt"}, common, []string{"--mode=http-connect", strategies}, tail),
			mounts: slices.Concat([]mount{clusterCert, clusterKey}, frontend, []mount{kubeconfig}),
			ports:  []int32{8132, 8133, 8134, 8090},
		},
		{
			name:   "grpc over uds, agents with client certificates",
			server: mtls,
			args: slices.Concat([]string{"server",
				"--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
				"--delete-existing-uds-file=true", "--server-port=0"}, common, []string{"--mode=grpc", strategies}, ports,
				[]string{"--cluster-ca-cert=/etc/kubernetes/pki/ca.crt"}),
			mounts: []mount{uds, clusterCert, clusterKey, file("cluster-ca-cert", "/etc/kubernetes/pki/ca.crt")},
			ports:  []int32{8132, 8133, 8134},
		},
		{
			name:   "http-connect over tcp, agent CA in its own directory",
			server: mtlsTCP,
			args: slices.Concat([]string{"server",
				"--server-bind-address=127.0.0.1", "--server-port=8090",
				"--server-cert=/etc/kubernetes/pki/konnectivity-frontend.crt",
				"--server-key=/etc/kubernetes/pki/konnectivity-frontend.key",
				"--server-ca-cert=/etc/kubernetes/frontend-ca/ca.crt"}, common, []string{"--mode=http-connect", strategies}, ports,
				[]string{"--cluster-ca-cert=/etc/kubernetes/agent-ca/ca.crt"}),
			mounts: slices.Concat([]mount{clusterCert, clusterKey}, frontend,
				[]mount{file("cluster-ca-cert", "/etc/kubernetes/agent-ca/ca.crt")}),
			ports: []int32{8132, 8133, 8134, 8090},
		},
		{
			// kubelet refuses a pod that mounts one path twice.
			name:   "http-connect over tcp, one CA for kube-apiserver and agents",
			server: oneCA,
			args: slices.Concat([]string{"server",
				"--server-bind-address=127.0.0.1", "--server-port=8090",
				"--server-cert=/etc/kubernetes/pki/konnectivity-frontend.crt",
				"--server-key=/etc/kubernetes/pki/konnectivity-frontend.key",
				"--server-ca-cert=/etc/kubernetes/pki/ca.crt"}, common, []string{"--mode=http-connect", strategies}, ports,
				[]string{"--cluster-ca-cert=/etc/kubernetes/pki/ca.crt"}),
			mounts: slices.Concat([]mount{clusterCert, clusterKey}, frontend[:2],
				[]mount{file("server-ca-cert", "/etc/kubernetes/pki/ca.crt")}),
			ports: []int32{8132, 8133, 8134, 8090},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := renderPod(t, tc.server)
			if pod.Name != "konnectivity-server" || pod.Namespace != "kube-system" {
				t.Errorf("pod %s/%s", pod.Namespace, pod.Name)
			}
			spec := pod.Spec
			if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" || spec.Priority == nil || *spec.Priority != 2000001000 {
				t.Errorf("hostNetwork %v, priorityClassName %q, priority %v; want the node-critical class and its value, as kubeadm's control-plane pods",
					spec.HostNetwork, spec.PriorityClassName, spec.Priority)
			}
			if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext %+v, want seccomp RuntimeDefault", spec.SecurityContext)
			}
			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers", len(spec.Containers))
			}
			c := spec.Containers[0]
			if c.Image != "ghcr.io/konnect-dev/konnect:v1.2.3" || !slices.Equal(c.Command, []string{"/usr/local/bin/konnect"}) {
				t.Errorf("image %q command %q", c.Image, c.Command)
			}
			if !slices.Equal(c.Args, tc.args) {
				t.Errorf("args\n got %q\nwant %q", c.Args, tc.args)
			}
			for _, p := range []struct {
				probe *corev1.Probe
				path  string
			}{{c.LivenessProbe, "/livez"}, {c.ReadinessProbe, "/readyz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("no HTTP probe for %s", p.path)
					continue
				}
				g := p.probe.HTTPGet
				if g.Path != p.path || g.Port.IntValue() != 8134 || g.Host != "127.0.0.1" || g.Scheme != corev1.URISchemeHTTP {
					t.Errorf("probe %s = %+v, want http://127.0.0.1:8134%s", p.path, g, p.path)
				}
			}
			var ports []int32
			for _, p := range c.Ports {
				if p.HostPort != p.ContainerPort {
					t.Errorf("port %s: hostPort %d != containerPort %d", p.Name, p.HostPort, p.ContainerPort)
				}
				ports = append(ports, p.ContainerPort)
			}
			if !slices.Equal(ports, tc.ports) {
				t.Errorf("ports %v, want %v", ports, tc.ports)
			}
			if len(spec.Volumes) != len(tc.mounts) || len(c.VolumeMounts) != len(tc.mounts) {
				t.Fatalf("%d volumes and %d mounts, want %d", len(spec.Volumes), len(c.VolumeMounts), len(tc.mounts))
			}
			for i, m := range tc.mounts {
				v, vm := spec.Volumes[i], c.VolumeMounts[i]
				if v.Name != m.name || v.HostPath == nil || v.HostPath.Path != m.path || v.HostPath.Type == nil || *v.HostPath.Type != m.t {
					t.Errorf("volume %d = %+v, want %s hostPath %s type %s", i, v, m.name, m.path, m.t)
				}
				if vm.Name != m.name || vm.MountPath != m.path || vm.ReadOnly != m.readOnly {
					t.Errorf("mount %d = %+v, want %s at %s readOnly %v", i, vm, m.name, m.path, m.readOnly)
				}
			}
			sc := c.SecurityContext
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
				t.Errorf("container securityContext %+v", sc)
			}
		})
	}
}

func TestServerRefusesBadInput(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Server)
		want string
	}{
		{"no image", func(s *Server) { s.Image = "" }, "image"},
		{"image with space", func(s *Server) { s.Image = "a b" }, "white space"},
		{"unknown mode", func(s *Server) { s.Mode = "socks" }, "--mode"},
		{"grpc over tcp", func(s *Server) { *s = tcpServer(); s.Mode = "grpc" }, "--uds-name"},
		{"relative socket", func(s *Server) { s.UDSName = "konnectivity.socket" }, "--uds-name"},
		{"relative cluster key", func(s *Server) { s.ClusterKey = "pki/k.key" }, "--cluster-key"},
		{"no kubeconfig", func(s *Server) { s.Kubeconfig = "" }, "--kubeconfig"},
		{"kubeconfig with client certificates", func(s *Server) { s.AgentClientCA = "/etc/kubernetes/pki/ca.crt" }, "--kubeconfig is not used"},
		{"relative agent CA", func(s *Server) { s.AgentClientCA, s.Kubeconfig = "pki/ca.crt", "" }, "--cluster-ca-cert"},
		{"frontend cert with uds", func(s *Server) { s.ServerCert = "/x.crt" }, "--server-cert"},
		{"tcp without ca", func(s *Server) { *s = tcpServer(); s.ServerCACert = "" }, "--server-ca-cert"},
		{"port clash", func(s *Server) { s.AdminPort = 8132 }, "both 8132"},
		{"port range", func(s *Server) { s.HealthPort = 70000 }, "--health-port"},
		{"bad bind address", func(s *Server) { *s = tcpServer(); s.FrontendBindAddress = "not an address" }, "--server-bind-address"},
		{"allowed agent names without a CA", func(s *Server) { s.AgentAllowedNames = []string{"konnectivity-agent"} }, "--cluster-allowed-names"},
		{"allowed frontend names with uds", func(s *Server) { s.FrontendAllowedNames = []string{"apiserver-egress-client"} }, "--server-allowed-names"},
		{"allowed name with a comma", func(s *Server) { *s = tcpServer(); s.FrontendAllowedNames = []string{"a,b"} }, "comma"},
		{"shared socket directory without a socket", func(s *Server) { *s = tcpServer(); s.AllowSharedUDSDir = true }, "--allow-shared-uds-dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := grpcServer()
			tc.edit(&s)
			if _, err := s.Render(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render() error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	a, err := grpcServer().Render()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		b, _ := grpcServer().Render()
		if string(a.Data) != string(b.Data) {
			t.Fatal("two renders of the same input differ")
		}
	}
	if strings.Contains(string(a.Data), "status:") || strings.Contains(string(a.Data), "creationTimestamp") {
		t.Errorf("rendered pod carries status or creationTimestamp:\n%s", a.Data)
	}
}
