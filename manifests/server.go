package manifests

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Server is the input of the konnectivity-server static pod, which runs `konnect server` with the
// arguments of upstream proxy-server. Paths are host paths; each is mounted at the same path in the pod.
type Server struct {
	// Image is the container image; Image(version) gives konnect's own.
	Image string
	// Binary is the konnect binary inside the image; empty means DefaultBinary.
	Binary string

	// Mode is "grpc" or "http-connect" and must match the egress selector configuration.
	Mode string
	// UDSName is the unix socket kube-apiserver dials. When it is empty the server listens for
	// kube-apiserver on TCP instead (http-connect only), with the Server* fields below.
	UDSName string
	// AllowSharedUDSDir passes --allow-shared-uds-dir: the server then binds UDSName also in a directory
	// that another user could change, which it otherwise refuses at start.
	AllowSharedUDSDir bool

	// FrontendBindAddress and FrontendPort are where kube-apiserver connects over TCP; empty and zero
	// mean 127.0.0.1 and DefaultFrontendPort.
	FrontendBindAddress string
	FrontendPort        int
	// ServerCert and ServerKey are the TCP frontend's serving certificate; ServerCACert verifies
	// kube-apiserver's client certificate.
	ServerCert, ServerKey, ServerCACert string

	// ClusterCert and ClusterKey are the agent-facing serving certificate.
	ClusterCert, ClusterKey string
	// Kubeconfig lets the server review agents' tokens (TokenReview) and keep its Lease as ServerUser. It
	// is required unless AgentClientCA is set, and must then be empty unless LeaseController is set.
	Kubeconfig string
	// LeaseController has the server keep a Lease in LeaseNamespace for agents to count
	// (--enable-lease-controller, see leases.go). It needs Kubeconfig, also with AgentClientCA.
	LeaseController bool
	// AgentClientCA switches agent authentication from service-account tokens to client certificates:
	// the server requires every agent to present a certificate signed by this CA (upstream's
	// --cluster-ca-cert) and reviews no tokens. Upstream refuses --cluster-ca-cert together with the
	// token flags, so those are then left out.
	AgentClientCA string
	// AgentAllowedNames (--cluster-allowed-names) and FrontendAllowedNames (--server-allowed-names) are the
	// common names that the client certificates checked against AgentClientCA and ServerCACert may have: a
	// cluster CA also signs kubelets' and users' certificates.
	AgentAllowedNames, FrontendAllowedNames []string

	// Ports; zero means the Default* constant.
	AgentPort, AdminPort, HealthPort int

	// FilesDigest, when set, goes into the pod's FilesDigestAnnotation: a digest of the files in
	// MountedFiles, so that a renewed certificate or kubeconfig changes the pod and kubelet restarts it.
	FilesDigest string
}

// FilesDigestAnnotation holds, on the server's static pod, a digest of the files it mounts one by one. A file
// bind mount keeps the inode it was made on, so the server sees a file replaced on the host only when the pod
// restarts; a changed annotation changes the static pod, and kubelet restarts it.
const FilesDigestAnnotation = "konnect.dev/mounted-files-sha256"

func (s Server) withDefaults() Server {
	if s.Binary == "" {
		s.Binary = DefaultBinary
	}
	if s.AgentPort == 0 {
		s.AgentPort = DefaultAgentPort
	}
	if s.AdminPort == 0 {
		s.AdminPort = DefaultAdminPort
	}
	if s.HealthPort == 0 {
		s.HealthPort = DefaultHealthPort
	}
	if s.UDSName == "" {
		if s.FrontendPort == 0 {
			s.FrontendPort = DefaultFrontendPort
		}
		if s.FrontendBindAddress == "" {
			s.FrontendBindAddress = "127.0.0.1"
		}
	}
	return s
}

// Validate reports the first problem with s, or nil.
func (s Server) Validate() error {
	s = s.withDefaults()
	if err := CheckImage(s.Image); err != nil {
		return fmt.Errorf("konnectivity-server: %w", err)
	}
	if err := checkAbs("konnectivity-server: binary", s.Binary); err != nil {
		return err
	}
	switch s.Mode {
	case "grpc", "http-connect":
	default:
		return fmt.Errorf("konnectivity-server: --mode %q: must be grpc or http-connect", s.Mode)
	}
	if len(s.AgentAllowedNames) > 0 && s.AgentClientCA == "" {
		return fmt.Errorf("konnectivity-server: --cluster-allowed-names needs --cluster-ca-cert")
	}
	if len(s.FrontendAllowedNames) > 0 && (s.UDSName != "" || s.ServerCACert == "") {
		return fmt.Errorf("konnectivity-server: --server-allowed-names needs the TCP frontend's --server-ca-cert")
	}
	for _, n := range append(slices.Clone(s.AgentAllowedNames), s.FrontendAllowedNames...) {
		if n == "" || strings.Contains(n, ",") {
			return fmt.Errorf("konnectivity-server: allowed name %q: must be non-empty and have no comma", n)
		}
	}
	files := []struct{ what, path string }{{"--cluster-cert", s.ClusterCert}, {"--cluster-key", s.ClusterKey}}
	if s.AgentClientCA != "" {
		if s.Kubeconfig != "" && !s.LeaseController {
			return fmt.Errorf("konnectivity-server: --kubeconfig is not used with --cluster-ca-cert: agents are authenticated by certificate, not by TokenReview")
		}
		files = append(files, struct{ what, path string }{"--cluster-ca-cert", s.AgentClientCA})
	}
	if s.AgentClientCA == "" || s.LeaseController {
		files = append(files, struct{ what, path string }{"--kubeconfig", s.Kubeconfig})
	}
	if s.AllowSharedUDSDir && s.UDSName == "" {
		return fmt.Errorf("konnectivity-server: --allow-shared-uds-dir applies only with --uds-name")
	}
	if s.UDSName != "" {
		files = append(files, struct{ what, path string }{"--uds-name", s.UDSName})
		if s.ServerCert != "" || s.ServerKey != "" || s.ServerCACert != "" {
			return fmt.Errorf("konnectivity-server: --server-cert, --server-key and --server-ca-cert apply only to a TCP frontend, not with --uds-name")
		}
	} else {
		if s.Mode == "grpc" {
			return fmt.Errorf("konnectivity-server: --mode grpc needs --uds-name: kube-apiserver speaks GRPC only over a unix socket")
		}
		files = append(files,
			struct{ what, path string }{"--server-cert", s.ServerCert},
			struct{ what, path string }{"--server-key", s.ServerKey},
			struct{ what, path string }{"--server-ca-cert", s.ServerCACert})
		if err := checkHost("konnectivity-server: --server-bind-address", s.FrontendBindAddress); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := checkAbs("konnectivity-server: "+f.what, f.path); err != nil {
			return err
		}
	}
	ports := []struct {
		what string
		port int
	}{{"--agent-port", s.AgentPort}, {"--admin-port", s.AdminPort}, {"--health-port", s.HealthPort}}
	if s.UDSName == "" {
		ports = append(ports, struct {
			what string
			port int
		}{"--server-port", s.FrontendPort})
	}
	seen := map[int]string{}
	for _, p := range ports {
		if err := checkPort("konnectivity-server: "+p.what, p.port); err != nil {
			return err
		}
		if other, dup := seen[p.port]; dup {
			return fmt.Errorf("konnectivity-server: %s and %s are both %d (the pod uses the host network)", other, p.what, p.port)
		}
		seen[p.port] = p.what
	}
	return nil
}

// Args returns the arguments of `konnect server`, in upstream proxy-server's spelling.
func (s Server) Args() []string {
	s = s.withDefaults()
	args := []string{"server"}
	if s.UDSName != "" {
		args = append(args,
			"--uds-name="+s.UDSName,
			// A socket left by a killed server would make the new one fail to listen.
			"--delete-existing-uds-file=true",
			"--server-port=0")
		if s.AllowSharedUDSDir {
			args = append(args, "--allow-shared-uds-dir")
		}
	} else {
		args = append(args,
			"--server-bind-address="+s.FrontendBindAddress,
			"--server-port="+strconv.Itoa(s.FrontendPort),
			"--server-cert="+s.ServerCert,
			"--server-key="+s.ServerKey,
			"--server-ca-cert="+s.ServerCACert)
	}
	args = append(args,
		"--cluster-cert="+s.ClusterCert,
		"--cluster-key="+s.ClusterKey,
		"--mode="+s.Mode,
		// A dial to a node's address (its kubelet, or a hostNetwork pod on it) goes to the agent that
		// named that address in --agent-identifiers=host=NODE_IP; any other address to any agent. Where
		// nodes cannot reach one another, a random agent fails such dials. k0s sets the same.
		"--proxy-strategies=destHost,default",
		"--agent-port="+strconv.Itoa(s.AgentPort),
		"--admin-port="+strconv.Itoa(s.AdminPort),
		// Health and metrics stay on the node's loopback; the probes below use 127.0.0.1.
		"--health-bind-address=127.0.0.1",
		"--health-port="+strconv.Itoa(s.HealthPort),
	)
	if len(s.FrontendAllowedNames) > 0 {
		args = append(args, "--server-allowed-names="+strings.Join(s.FrontendAllowedNames, ","))
	}
	if s.AgentClientCA != "" {
		args = append(args, "--cluster-ca-cert="+s.AgentClientCA)
		if len(s.AgentAllowedNames) > 0 {
			args = append(args, "--cluster-allowed-names="+strings.Join(s.AgentAllowedNames, ","))
		}
		if s.Kubeconfig != "" { // for the lease controller only
			args = append(args, "--kubeconfig="+s.Kubeconfig)
		}
	} else {
		args = append(args,
			"--agent-namespace="+Namespace,
			"--agent-service-account="+AgentServiceAccount,
			"--kubeconfig="+s.Kubeconfig,
			"--authentication-audience="+Audience,
		)
	}
	if s.LeaseController {
		args = append(args, "--enable-lease-controller", "--lease-namespace="+LeaseNamespace)
	}
	return args
}

// Pod builds the static pod.
func (s Server) Pod() (*corev1.Pod, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	s = s.withDefaults()

	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	mounted := map[string]bool{}
	add := func(name, path string, t corev1.HostPathType, readOnly bool) {
		// One file may serve two flags (--server-ca-cert and --cluster-ca-cert are both the cluster CA when
		// agents and kube-apiserver use client certificates): kubelet refuses a pod that mounts a path twice.
		if mounted[path] {
			return
		}
		mounted[path] = true
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(t)},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: path, ReadOnly: readOnly})
	}
	udsDir := ""
	if s.UDSName != "" {
		udsDir = filepath.Dir(filepath.Clean(s.UDSName))
		add("konnectivity-uds", udsDir, corev1.HostPathDirectoryOrCreate, false)
	}
	// Each file the server reads is mounted on its own, read-only, and nothing else of its directory:
	// the certificates' directory also holds the CA keys (ca.key, front-proxy-ca.key), which the server
	// must not see. A file bind mount pins the inode it was made on, so a certificate renewed by rename
	// (konnect certs renew) reaches the server when the static pod restarts, not before (FilesDigest).
	for _, f := range s.fileMounts() {
		add(f.name, f.path, corev1.HostPathFile, true)
	}
	var annotations map[string]string
	if s.FilesDigest != "" {
		annotations = map[string]string{FilesDigestAnnotation: s.FilesDigest}
	}

	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Host: "127.0.0.1", Path: path, Port: intstr.FromInt32(int32(s.HealthPort)), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   5,
			FailureThreshold: failures,
		}
	}
	liveness := probe("/livez", 10, 8)
	liveness.InitialDelaySeconds = 10
	ports := []corev1.ContainerPort{
		{Name: "agent", ContainerPort: int32(s.AgentPort), HostPort: int32(s.AgentPort), Protocol: corev1.ProtocolTCP},
		{Name: "admin", ContainerPort: int32(s.AdminPort), HostPort: int32(s.AdminPort), Protocol: corev1.ProtocolTCP},
		{Name: "health", ContainerPort: int32(s.HealthPort), HostPort: int32(s.HealthPort), Protocol: corev1.ProtocolTCP},
	}
	if s.UDSName == "" {
		ports = append(ports, corev1.ContainerPort{Name: "frontend", ContainerPort: int32(s.FrontendPort), HostPort: int32(s.FrontendPort), Protocol: corev1.ProtocolTCP})
	}

	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        "konnectivity-server",
			Namespace:   Namespace,
			Labels:      commonLabels(map[string]string{"component": "konnectivity-server", "tier": "control-plane"}),
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			HostNetwork: true,
			// As kubeadm's control-plane pods: node-critical, so that the kubelet's OOM score protects it
			// (only node-critical pods get -997), and with the class's value written out, since a static
			// pod passes no admission that would fill it in and graceful node shutdown orders pods by it.
			// kube-apiserver must not outlive its tunnel.
			PriorityClassName: "system-node-critical",
			Priority:          ptr.To[int32](systemNodeCriticalPriority),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "konnectivity-server",
				Image:           s.Image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{s.Binary},
				Args:            s.Args(),
				Ports:           ports,
				LivenessProbe:   liveness,
				ReadinessProbe:  probe("/readyz", 5, 3),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("128Mi"), // about what 1,000 tunnels take
				}},
				VolumeMounts: mounts,
				// Root, because the keys are root's 0600 files and the socket directory is root's; but with
				// no capabilities, so root is just the owner of those files.
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                ptr.To[int64](0),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: volumes,
		},
	}, nil
}

// systemNodeCriticalPriority is the value of PriorityClass system-node-critical
// (SystemCriticalPriority + 1000 in Kubernetes' scheduling API), the value kubeadm writes into its static pods.
const systemNodeCriticalPriority = 2000001000

// fileMount is a file the pod mounts on its own, and the volume's name.
type fileMount struct{ name, path string }

// fileVolumes name the volumes of the files the server reads, in the order the pod mounts them.
var fileVolumes = []string{"cluster-cert", "cluster-key", "server-cert", "server-key", "server-ca-cert", "cluster-ca-cert", "kubeconfig"}

// fileMounts are the files the server reads, each mounted on its own.
func (s Server) fileMounts() []fileMount {
	var out []fileMount
	for i, path := range []string{s.ClusterCert, s.ClusterKey, s.ServerCert, s.ServerKey, s.ServerCACert, s.AgentClientCA, s.Kubeconfig} {
		if path != "" {
			out = append(out, fileMount{fileVolumes[i], filepath.Clean(path)})
		}
	}
	return out
}

// MountedFiles are the host files the pod mounts one by one, in a fixed order: FilesDigest covers them.
func (s Server) MountedFiles() []string {
	var out []string
	for _, f := range s.fileMounts() {
		if !slices.Contains(out, f.path) {
			out = append(out, f.path)
		}
	}
	return out
}

// ServerPodFile is the file name of the server's static pod in kubelet's manifest directory.
const ServerPodFile = "konnectivity-server.yaml"

// Render renders the static pod as ServerPodFile, for kubelet's manifest directory.
func (s Server) Render() (File, error) {
	pod, err := s.Pod()
	if err != nil {
		return File{}, err
	}
	data, err := marshal(pod)
	if err != nil {
		return File{}, fmt.Errorf("render %s: %w", ServerPodFile, err)
	}
	// 0600 like the static pods kubeadm writes: the manifest names the key files.
	return File{Name: ServerPodFile, Data: data, Mode: secretMode}, nil
}
