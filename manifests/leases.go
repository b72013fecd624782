package manifests

import (
	"fmt"
	"net/netip"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// Server leases are upstream's way for agents to learn how many servers there are when the servers sit
// behind one address and their number changes: each server keeps a Lease (--enable-lease-controller,
// labelled k8s-app=konnectivity-server, upstream's default), and agents count the Leases
// (--count-server-leases) instead of trusting the servers' --server-count.

// LeaseNamespace holds the servers' Leases, instead of upstream's default kube-system: the lease controller
// must update and delete Leases it did not create (expired ones of other servers), and RBAC can limit that
// only to a namespace. In kube-system it would reach the leader-election Leases of kube-controller-manager
// and kube-scheduler, and kube-apiserver's identity Leases.
const LeaseNamespace = "konnectivity-leases"

// AgentKubeconfigConfigMap holds the agents' kubeconfig for watching the Leases. It names files of the
// projected volume and holds no credential.
const AgentKubeconfigConfigMap = "konnectivity-agent-kubeconfig"

// Files of the agent's projected volume that only server leases need.
const (
	agentKubeconfigFile  = "kubeconfig"
	agentAPITokenFile    = "apiserver-token"
	agentAPIServerCAFile = "apiserver-ca.crt"
)

// CheckAgentAPIServerURL refuses an API server URL that agents on other nodes could not use: anything but an
// https URL whose host is not loopback.
func CheckAgentAPIServerURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%q: agents need https://HOST[:PORT]", raw)
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
		return fmt.Errorf("%q: %s is each agent's own node, not the control plane; agents need an address every node reaches kube-apiserver at", raw, host)
	}
	return nil
}

// leaseArgs are the agent's flags for counting server Leases with its own kubeconfig.
func (a Agent) leaseArgs() []string {
	return []string{"--count-server-leases", "--lease-namespace=" + LeaseNamespace, "--kubeconfig=" + agentCredentialsDir + "/" + agentKubeconfigFile}
}

// leaseCredentials are what the agent needs to watch the Leases: its kubeconfig, kube-apiserver's CA, and
// a token bound to the agent's pod with kube-apiserver's own audience (the default), separate from the one
// it shows the server.
func (a Agent) leaseCredentials() []corev1.VolumeProjection {
	return []corev1.VolumeProjection{
		{ConfigMap: &corev1.ConfigMapProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: AgentKubeconfigConfigMap},
			Items:                []corev1.KeyToPath{{Key: agentKubeconfigFile, Path: agentKubeconfigFile}},
		}},
		{ConfigMap: &corev1.ConfigMapProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
			Items:                []corev1.KeyToPath{{Key: agentCAFile, Path: agentAPIServerCAFile}},
		}},
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
			ExpirationSeconds: ptr.To[int64](tokenExpiry),
			Path:              agentAPITokenFile,
		}},
	}
}

// agentKubeconfig is the kubeconfig in AgentKubeconfigConfigMap: APIServerURL, with the projected CA and
// token.
func (a Agent) agentKubeconfig() (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: a.APIServerURL, CertificateAuthority: agentCredentialsDir + "/" + agentAPIServerCAFile}
	kc.AuthInfos[AgentServiceAccount] = &clientcmdapi.AuthInfo{TokenFile: agentCredentialsDir + "/" + agentAPITokenFile}
	kc.Contexts["default"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: AgentServiceAccount, Namespace: Namespace}
	kc.CurrentContext = "default"
	b, err := clientcmd.Write(*kc)
	return string(b), err
}

// leaseObjects are the agents' kubeconfig, LeaseNamespace, and the least privilege on Leases there: the
// server's lease controller gets, creates and renews its own Lease, deletes it on shutdown, and lists and
// deletes the expired Leases of other servers, so none of its verbs can be limited to one name; an agent
// lists and watches them (an informer).
func (a Agent) leaseObjects() ([]namedObject, error) {
	kubeconfig, err := a.agentKubeconfig()
	if err != nil {
		return nil, err
	}
	role := func(name string, verbs []string, subject rbacv1.Subject) []namedObject {
		meta := metav1.ObjectMeta{Name: name, Namespace: LeaseNamespace, Labels: commonLabels(nil)}
		return []namedObject{
			{name: name + "-role.yaml", obj: &rbacv1.Role{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
				ObjectMeta: meta,
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: verbs}},
			}},
			{name: name + "-rolebinding.yaml", obj: &rbacv1.RoleBinding{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
				ObjectMeta: meta,
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
				Subjects:   []rbacv1.Subject{subject},
			}},
		}
	}
	objs := []namedObject{{name: LeaseNamespace + "-namespace.yaml", obj: &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: LeaseNamespace, Labels: commonLabels(nil)},
	}}, {name: AgentKubeconfigConfigMap + ".yaml", obj: &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: AgentKubeconfigConfigMap, Namespace: Namespace, Labels: commonLabels(nil)},
		Data:       map[string]string{agentKubeconfigFile: kubeconfig},
	}}}
	objs = append(objs, role("konnectivity-server-leases", []string{"get", "list", "create", "update", "delete"},
		rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ServerUser})...)
	objs = append(objs, role("konnectivity-agent-leases", []string{"list", "watch"},
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: AgentServiceAccount, Namespace: Namespace})...)
	return objs, nil
}
