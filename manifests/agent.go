package manifests

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/address"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Agent is the input of the cluster-side manifests: the konnectivity-agent DaemonSet running
// `konnect agent`, its ServiceAccount, and either the RBAC the server needs to review the agents' tokens
// or, with client-certificate authentication, the Secret holding the agents' certificate.
type Agent struct {
	// Image is the container image; Image(version) gives konnect's own.
	Image string
	// Binary is the konnect binary inside the image; empty means DefaultBinary.
	Binary string

	// ProxyServerHost and ProxyServerPort are where agents reach the server: a control-plane address, a
	// load balancer in front of several, or a comma-separated list of servers (each may carry its own
	// :port), which `konnect agent` connects to one by one. Zero ProxyServerPort means DefaultAgentPort.
	ProxyServerHost string
	ProxyServerPort int

	// CACert is the PEM of the CA that signed the server's agent-facing certificate. When set it is
	// shipped in a ConfigMap of its own; when empty agents use the cluster CA from the kube-root-ca.crt
	// ConfigMap that kube-controller-manager publishes in every namespace.
	CACert []byte

	// ClientCert and ClientKey, both PEM, switch agents from service-account tokens to client
	// certificates (the server then needs Server.AgentClientCA): they are shipped in the
	// kubernetes.io/tls Secret AgentTLSSecret, rendered in a file of its own with mode 0600, and the
	// agents get no service-account token at all. Both empty means token authentication.
	ClientCert, ClientKey []byte

	// HealthPort is the agent's health port (probes); zero means DefaultAgentHealthPort.
	HealthPort int

	// ServerLeases has agents count the servers' Leases (--count-server-leases, see leases.go), watching
	// them at APIServerURL, an https URL of kube-apiserver that every node reaches. It also renders the
	// Roles on Leases for the agents and for the servers' lease controller (Server.LeaseController).
	ServerLeases bool
	APIServerURL string
}

// Paths inside the agent pod.
const (
	agentCredentialsDir = "/var/run/secrets/konnectivity-agent"
	agentTokenFile      = "token"
	agentCAFile         = "ca.crt"
	agentCertFile       = corev1.TLSCertKey
	agentKeyFile        = corev1.TLSPrivateKeyKey
	// agentKeyMode keeps the key from other users of the node's filesystem; the pod's fsGroup lets
	// the agent, which is not root, read it.
	agentKeyMode = 0o440
	// AgentCAConfigMap is the ConfigMap rendered when Agent.CACert is set.
	AgentCAConfigMap = "konnectivity-agent-ca"
	// AgentTLSSecret is the Secret rendered when Agent.ClientCert is set.
	AgentTLSSecret  = "konnectivity-agent-tls"
	rootCAConfigMap = "kube-root-ca.crt"
	// tokenExpiry is how long a projected token lives; kubelet refreshes it at 80% of that.
	tokenExpiry = 3600
)

func (a Agent) withDefaults() Agent {
	if a.Binary == "" {
		a.Binary = DefaultBinary
	}
	if a.ProxyServerPort == 0 {
		a.ProxyServerPort = DefaultAgentPort
	}
	if a.HealthPort == 0 {
		a.HealthPort = DefaultAgentHealthPort
	}
	return a
}

// Validate reports the first problem with a, or nil.
func (a Agent) Validate() error {
	a = a.withDefaults()
	if err := CheckImage(a.Image); err != nil {
		return fmt.Errorf("konnectivity-agent: %w", err)
	}
	if err := checkAbs("konnectivity-agent: binary", a.Binary); err != nil {
		return err
	}
	if a.ProxyServerHost == "" {
		return fmt.Errorf("konnectivity-agent: --proxy-server-host: a host is required")
	}
	for _, entry := range strings.Split(a.ProxyServerHost, ",") {
		host := entry
		if h, port, err := net.SplitHostPort(entry); err == nil {
			n, err := strconv.Atoi(port)
			if err != nil {
				return fmt.Errorf("konnectivity-agent: --proxy-server-host entry %q: bad port", entry)
			}
			if err := checkPort("konnectivity-agent: --proxy-server-host entry "+entry+": port", n); err != nil {
				return err
			}
			host = h
		}
		if err := checkHost("konnectivity-agent: --proxy-server-host", host); err != nil {
			return err
		}
		// An agent dialling 0.0.0.0 or :: reaches its own node, never the server.
		if err := address.CheckDialable(host); err != nil {
			return fmt.Errorf("konnectivity-agent: --proxy-server-host: %w", err)
		}
	}
	if err := checkPort("konnectivity-agent: --proxy-server-port", a.ProxyServerPort); err != nil {
		return err
	}
	if err := checkPort("konnectivity-agent: --health-server-port", a.HealthPort); err != nil {
		return err
	}
	if a.ServerLeases {
		if err := CheckAgentAPIServerURL(a.APIServerURL); err != nil {
			return fmt.Errorf("konnectivity-agent: API server URL for the Leases: %w", err)
		}
	}
	if len(a.CACert) > 0 && !pki.HasPEMBlock(a.CACert, "CERTIFICATE") {
		return fmt.Errorf("konnectivity-agent: CA certificate: no PEM CERTIFICATE block")
	}
	if len(a.ClientCert) > 0 || len(a.ClientKey) > 0 {
		if !pki.HasPEMBlock(a.ClientCert, "CERTIFICATE") {
			return fmt.Errorf("konnectivity-agent: --agent-cert: no PEM CERTIFICATE block")
		}
		if !pki.HasPEMBlock(a.ClientKey, "PRIVATE KEY") {
			return fmt.Errorf("konnectivity-agent: --agent-key: no PEM PRIVATE KEY block")
		}
		// Caught here rather than by every agent failing its handshake after `kubectl apply`. The
		// error names no key material.
		if _, err := tls.X509KeyPair(a.ClientCert, a.ClientKey); err != nil {
			return fmt.Errorf("konnectivity-agent: --agent-cert and --agent-key: %w", err)
		}
	}
	return nil
}

// clientCertAuth reports whether agents authenticate with a client certificate.
func (a Agent) clientCertAuth() bool { return len(a.ClientCert) > 0 }

// Args returns the arguments of `konnect agent`, in upstream proxy-agent's spelling.
func (a Agent) Args() []string {
	a = a.withDefaults()
	args := []string{
		"agent",
		"--proxy-server-host=" + a.ProxyServerHost,
		"--proxy-server-port=" + strconv.Itoa(a.ProxyServerPort),
		"--ca-cert=" + agentCredentialsDir + "/" + agentCAFile,
	}
	if a.clientCertAuth() {
		args = append(args,
			"--agent-cert="+agentCredentialsDir+"/"+agentCertFile,
			"--agent-key="+agentCredentialsDir+"/"+agentKeyFile)
	} else {
		args = append(args, "--service-account-token-path="+agentCredentialsDir+"/"+agentTokenFile)
	}
	if a.ServerLeases {
		args = append(args, a.leaseArgs()...)
	}
	return append(args,
		// The server's destHost strategy sends dials for the node's own address to this agent.
		"--agent-identifiers=host=$(NODE_IP)",
		// Bound to the pod's own address, which is where kubelet sends the probes.
		"--health-server-host=$(POD_IP)",
		"--health-server-port="+strconv.Itoa(a.HealthPort),
	)
}

// DaemonSet builds the agent DaemonSet.
func (a Agent) DaemonSet() (*appsv1.DaemonSet, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	a = a.withDefaults()
	labels := map[string]string{"k8s-app": "konnectivity-agent"}
	podSecurity := &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To[int64](65534),
		RunAsGroup:     ptr.To[int64](65534),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if a.clientCertAuth() {
		// The key in the projected Secret is readable by the agent's group only.
		podSecurity.FSGroup = ptr.To[int64](65534)
	}

	return &appsv1.DaemonSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      "konnectivity-agent",
			Namespace: Namespace,
			Labels:    commonLabels(labels),
		},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type: appsv1.RollingUpdateDaemonSetStrategyType,
				// Surge: a node's new agent starts and connects before its old one is told to drain, so the
				// node is never without an agent; its readiness waits until it has reached every server
				// (or 30 s), so the old one is not replaced by one that serves fewer servers
				// (agent.ReadyChecks, initial-sync). Possible because the agent uses no host port or host
				// network.
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{
					MaxSurge:       ptr.To(intstr.FromString("10%")),
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: commonLabels(labels)},
				Spec: corev1.PodSpec{
					ServiceAccountName: AgentServiceAccount,
					// Nothing is automounted: the agent's credentials are in the projected volume below, and it
					// calls the API only with ServerLeases, to watch the Leases.
					AutomountServiceAccountToken: ptr.To(false),
					PriorityClassName:            "system-node-critical",
					NodeSelector:                 map[string]string{"kubernetes.io/os": "linux"},
					// Every node, tainted or not: a node without an agent is a node kube-apiserver cannot
					// reach for logs, exec or webhooks.
					Tolerations: []corev1.Toleration{
						{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
					},
					SecurityContext: podSecurity,
					Containers:      []corev1.Container{a.container()},
					Volumes: []corev1.Volume{{
						Name: "konnectivity-agent-credentials",
						VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
							Sources: a.credentials(),
						}},
					}},
				},
			},
		},
	}, nil
}

// container is the agent's container: its flags, health port and probes, and a read-only, unprivileged
// root.
func (a Agent) container() corev1.Container {
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("health"), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   5,
			FailureThreshold: failures,
		}
	}
	liveness := probe("/livez", 10, 3)
	liveness.InitialDelaySeconds = 15
	return corev1.Container{
		Name:            "konnectivity-agent",
		Image:           a.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{a.Binary},
		Args:            a.Args(),
		Env: []corev1.EnvVar{
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"},
			}},
			{Name: "NODE_IP", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.hostIP"},
			}},
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi"),
		}},
		Ports: []corev1.ContainerPort{
			{Name: "health", ContainerPort: int32(a.HealthPort), Protocol: corev1.ProtocolTCP},
		},
		LivenessProbe:  liveness,
		ReadinessProbe: probe("/readyz", 5, 3),
		VolumeMounts: []corev1.VolumeMount{
			{Name: "konnectivity-agent-credentials", MountPath: agentCredentialsDir, ReadOnly: true},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
}

// credentials are the sources of the agent's one projected volume: the CA that signs the server's
// certificate, either a bound token for the server to review or the agent's client certificate, and with
// ServerLeases what watching the Leases takes.
func (a Agent) credentials() []corev1.VolumeProjection {
	sources := a.serverCredentials()
	if a.ServerLeases {
		sources = append(sources, a.leaseCredentials()...)
	}
	return sources
}

// serverCredentials are what the agent shows the server and checks it against.
func (a Agent) serverCredentials() []corev1.VolumeProjection {
	caConfigMap := rootCAConfigMap
	if len(a.CACert) > 0 {
		caConfigMap = AgentCAConfigMap
	}
	ca := corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{
		LocalObjectReference: corev1.LocalObjectReference{Name: caConfigMap},
		Items:                []corev1.KeyToPath{{Key: agentCAFile, Path: agentCAFile}},
	}}
	if a.clientCertAuth() {
		// No token: the certificate is the agent's only credential, and a token it does not need
		// would still let anyone who reads it talk to kube-apiserver as the agent.
		return []corev1.VolumeProjection{ca, {Secret: &corev1.SecretProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: AgentTLSSecret},
			Items: []corev1.KeyToPath{
				{Key: corev1.TLSCertKey, Path: agentCertFile},
				{Key: corev1.TLSPrivateKeyKey, Path: agentKeyFile, Mode: ptr.To[int32](agentKeyMode)},
			},
		}}}
	}
	return []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
		Audience:          Audience,
		ExpirationSeconds: ptr.To[int64](tokenExpiry),
		Path:              agentTokenFile,
	}}, ca}
}

// AgentBundleFiles are the names of every file Render can write, in any variant, besides kustomization.yaml:
// what a later run may take out of the directory when a variant no longer writes it.
var AgentBundleFiles = []string{
	"konnectivity-agent-ca.yaml", AgentTLSSecret + ".yaml", "konnectivity-agent-serviceaccount.yaml",
	"konnectivity-server-clusterrole.yaml", "konnectivity-server-rbac.yaml",
	LeaseNamespace + "-namespace.yaml", AgentKubeconfigConfigMap + ".yaml",
	"konnectivity-server-leases-role.yaml", "konnectivity-server-leases-rolebinding.yaml",
	"konnectivity-agent-leases-role.yaml", "konnectivity-agent-leases-rolebinding.yaml",
	"konnectivity-agent.yaml",
}

// Render renders the cluster-side manifests and a kustomization.yaml listing them, for
// `kubectl apply -k DIR`: the CA ConfigMap (only with CACert), the agents' certificate Secret (only
// with ClientCert; mode 0600), the agents' ServiceAccount, the ClusterRoleBinding that lets the server
// review the agents' tokens (only without ClientCert), with ServerLeases the agents' kubeconfig and the
// Roles on Leases, and the DaemonSet.
func (a Agent) Render() ([]File, error) {
	ds, err := a.DaemonSet()
	if err != nil {
		return nil, err
	}
	var objs []namedObject
	if len(a.CACert) > 0 {
		objs = append(objs, namedObject{name: "konnectivity-agent-ca.yaml", obj: &corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Name: AgentCAConfigMap, Namespace: Namespace, Labels: commonLabels(nil)},
			Data:       map[string]string{agentCAFile: string(a.CACert)},
		}})
	}
	if a.clientCertAuth() {
		objs = append(objs, namedObject{name: AgentTLSSecret + ".yaml", secret: true, obj: &corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: AgentTLSSecret, Namespace: Namespace, Labels: commonLabels(nil)},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: a.ClientCert, corev1.TLSPrivateKeyKey: a.ClientKey},
		}})
	}
	// The pods still name the ServiceAccount, so it exists in both variants.
	objs = append(objs, namedObject{name: "konnectivity-agent-serviceaccount.yaml", obj: &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: AgentServiceAccount, Namespace: Namespace, Labels: commonLabels(nil)},
	}})
	if !a.clientCertAuth() {
		// The server authenticates agents with TokenReview, and reads the Node that a review names to keep
		// only the agent identifiers that are that node's addresses (egress/tunnel/identity.go); it needs
		// nothing else: not system:auth-delegator, whose SubjectAccessReviews would let it ask what any user
		// may do. With client certificates it reviews nothing and gets no grant. The binding is not named
		// system:konnectivity-server, as the Kubernetes documentation's binding to system:auth-delegator is:
		// a roleRef cannot change, so applying this bundle over that binding would fail.
		objs = append(objs,
			namedObject{name: "konnectivity-server-clusterrole.yaml", obj: &rbacv1.ClusterRole{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
				ObjectMeta: metav1.ObjectMeta{Name: ServerTokenReviewRole, Labels: commonLabels(nil)},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
					{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
				},
			}},
			namedObject{name: "konnectivity-server-rbac.yaml", obj: &rbacv1.ClusterRoleBinding{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
				ObjectMeta: metav1.ObjectMeta{Name: ServerTokenReviewRole, Labels: commonLabels(nil)},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ServerTokenReviewRole},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ServerUser}},
			}})
	}
	if a.ServerLeases {
		leases, err := a.leaseObjects()
		if err != nil {
			return nil, err
		}
		objs = append(objs, leases...)
	}
	objs = append(objs, namedObject{name: "konnectivity-agent.yaml", obj: ds})
	return renderAll(objs)
}
