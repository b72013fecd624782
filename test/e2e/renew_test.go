//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// renewServerCerts runs konnect certs renew on cp for the server's serving certificate and its kube-apiserver
// client certificate (in its kubeconfig). The static pod mounts both files one by one, so its container keeps
// the old ones until it restarts: renew changes the pod's digest annotation, and the real kubelet restarts it.
// Then the mirror pod carries the new annotation and is Ready (its readiness reviews a token with the
// kubeconfig), the agent port serves the renewed certificate, the new container sees the renewed files, and
// the APIService works through the tunnel again.
func (nc *nodeCluster) renewServerCerts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	agentPort := net.JoinHostPort(cpAddr, fmt.Sprint(manifests.DefaultAgentPort))
	podFile := filepath.Join(nc.konnectDir, "manifests", manifests.ServerPodFile)
	fileDigest := func() string {
		t.Helper()
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(readFile(podFile)), &pod); err != nil {
			t.Fatal(err)
		}
		return pod.Annotations[manifests.FilesDigestAnnotation]
	}
	mirror := func() (digest, ready string, err error) {
		out, err := nc.kubectl(ctx, nsCP, "-n", "kube-system", "get", "pod", "konnectivity-server-cp", "-o",
			`jsonpath={.metadata.annotations.konnect\.dev/mounted-files-sha256} {.status.conditions[?(@.type=="Ready")].status}`)
		if f := strings.Fields(out); err == nil && len(f) == 2 {
			return f[0], f[1], nil
		}
		return "", "", fmt.Errorf("mirror pod: %q %v", out, err)
	}
	old := fileDigest()
	if d, ready, err := mirror(); err != nil || d != old || ready != "True" {
		t.Fatalf("before the renewal: mirror pod annotation %q Ready %q (%v), manifest's %q", d, ready, err, old)
	}
	oldSerial, err := nc.agentPortSerialAt(agentPort)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out, err := harness.Run(ctx, "", bins.konnect, "certs", "renew", "konnectivity-server", "konnectivity-server-client", "--dir", nc.konnectDir)
	if err != nil {
		t.Fatalf("konnect certs renew: %v\n%s", err, out)
	}
	if !strings.Contains(out, "next: kubelet restarts the konnectivity-server static pod") {
		t.Errorf("konnect certs renew does not say that the server pod restarts:\n%s", out)
	}
	renewed := fileDigest()
	if renewed == old {
		t.Fatalf("konnect certs renew left the annotation of %s as it was:\n%s", podFile, out)
	}
	crt := filepath.Join(nc.pki, "konnectivity-server.crt")
	onDisk, err := pkitest.Load(crt, filepath.Join(nc.pki, "konnectivity-server.key"))
	if err != nil {
		t.Fatal(err)
	}
	if onDisk.Cert.SerialNumber.Cmp(oldSerial) == 0 {
		t.Fatal("konnect certs renew did not change the certificate")
	}

	if err := harness.Poll("kubelet to run the server pod with the new annotation, Ready", 2*time.Minute, time.Second, func() error {
		d, ready, err := mirror()
		if err == nil && (d != renewed || ready != "True") {
			err = fmt.Errorf("mirror pod annotation %q Ready %q", d, ready)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	restarted := time.Since(start)
	if err := harness.Poll("the agent port to serve the renewed certificate", time.Minute, time.Second, func() error {
		got, err := nc.agentPortSerialAt(agentPort)
		if err == nil && got.Cmp(onDisk.Cert.SerialNumber) != 0 {
			err = fmt.Errorf("serving serial %x, on disk %x", got, onDisk.Cert.SerialNumber)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	root := fmt.Sprintf("/proc/%d/root", nc.containerPID(t, nsCP, "kube-system", "konnectivity-server-cp"))
	for _, f := range []string{crt, filepath.Join(nc.konnectDir, "konnectivity-server.conf")} {
		if inPod, err := os.ReadFile(root + f); err != nil || !bytes.Equal(inPod, []byte(readFile(f))) {
			t.Errorf("the server container does not see the renewed %s (%v)", f, err)
		}
	}
	if err := harness.Poll("flunders through the tunnel", time.Minute, time.Second, func() error { return nc.flundersWork(ctx) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("renewal to new mirror pod Ready %v, to flunders served %v; serving serial %x -> %x, and the container sees the renewed certificate and kubeconfig",
		restarted.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond), oldSerial, onDisk.Cert.SerialNumber)
}
