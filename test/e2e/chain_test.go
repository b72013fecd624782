//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// checkChain proves that kube-apiserver reaches sample-apiserver, and only
// through the tunnel: the APIService becomes Available, flunders can be
// listed, created, read and deleted from cp, and a direct dial from cp to
// the pod address is unreachable.
func (c *cluster) checkChain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := c.waitAPIService(ctx, "True", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("APIService %s Available after %v", apiServiceName, time.Since(start).Round(100*time.Millisecond))
	c.checkFlunders(t, ctx, nsCP, "")
	t.Logf("flunders: list, create, get, delete from cp work")
	// The second version's APIService, from the same run of konnect certs apiservice, with the same caBundle.
	if err := harness.Poll("wardle.example.com/v1beta1 served", 30*time.Second, time.Second, func() error {
		_, err := c.kubectl(ctx, nsCP, "get", "--raw", "/apis/wardle.example.com/v1beta1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := expectUnreachable(c.tp.ns(nsCP), net.JoinHostPort(podAddr, strconv.Itoa(podPort))); err != nil {
		t.Fatal(err)
	}
	t.Logf("direct dial from cp to %s:%d: network is unreachable (as it must be)", podAddr, podPort)
}

// checkFlunders creates, lists, reads and deletes a Flunder with kubectl
// from namespace role (kubeconfig "" means the admin one).
func (c *cluster) checkFlunders(t *testing.T, ctx context.Context, role, kubeconfig string) {
	t.Helper()
	if kubeconfig == "" {
		kubeconfig = c.kubeconfig
	}
	kc := func(args ...string) (string, error) {
		return harness.Run(ctx, c.tp.ns(role), append([]string{bins.kubectl, "--kubeconfig", kubeconfig}, args...)...)
	}
	name := "e2e-" + randHex(3)
	manifest := filepath.Join(c.dir, name+".yaml")
	if err := os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: wardle.example.com/v1alpha1
kind: Flunder
metadata:
  name: %s
  namespace: default
spec: {}
`, name)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := kc("get", "flunders", "-n", "default"); err != nil {
		t.Fatalf("list flunders: %v", err)
	}
	if _, err := kc("create", "-f", manifest); err != nil {
		t.Fatalf("create flunder: %v", err)
	}
	out, err := kc("get", "flunders", "-n", "default", "-o", "name")
	if err != nil {
		t.Fatalf("list flunders after create: %v", err)
	}
	if !strings.Contains(out, "flunder.wardle.example.com/"+name) {
		t.Fatalf("flunder %s not listed; got %q", name, out)
	}
	if _, err := kc("delete", "flunder", "-n", "default", name, "--wait=true"); err != nil {
		t.Fatalf("delete flunder: %v", err)
	}
	out, err = kc("get", "flunders", "-n", "default", "-o", "name")
	if err != nil {
		t.Fatalf("list flunders after delete: %v", err)
	}
	if strings.Contains(out, "/"+name+"\n") || strings.HasSuffix(out, "/"+name) {
		t.Fatalf("flunder %s still listed after delete: %q", name, out)
	}
}

// flundersWork reports whether a list of flunders succeeds now.
func (c *cluster) flundersWork(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := c.kubectl(ctx, nsCP, "get", "flunders", "-n", "default", "--request-timeout=10s")
	return err
}

// expectAPIServiceDown makes sure the APIService is not Available before a
// scenario starts its tunnel, so that Available=True afterwards is the
// tunnel's doing and not a status left over from an earlier scenario.
func (c *cluster) expectAPIServiceDown(t *testing.T) {
	t.Helper()
	if !c.tunnelStarted {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	defer func() {
		t.Logf("APIService reported the tunnel down after %v", time.Since(start).Round(100*time.Millisecond))
	}()
	err := harness.Poll("APIService "+apiServiceName+" to report the tunnel down", 45*time.Second, 3*time.Second, func() error {
		if err := c.poke(ctx); err != nil {
			return err
		}
		return c.waitAPIService(ctx, "False", 3*time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// doctorAgent is one agent as konnect doctor status -o json reports it.
type doctorAgent struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"`
	LastError string `json:"lastError"`
}

// doctorStatus runs `konnect doctor status -o json` in cp against the admin
// endpoints and returns, per server ID, its agents by ID.
func (c *cluster) doctorStatus(t *testing.T, adminPorts ...int) map[string]map[string]doctorAgent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var addrs []string
	for _, p := range adminPorts {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	out, err := harness.Run(ctx, c.tp.ns(nsCP), bins.konnect, "doctor", "status", "-o", "json", "--admin-address", strings.Join(addrs, ","))
	if err != nil {
		t.Fatalf("konnect doctor status: %v\n%s", err, out)
	}
	type result struct {
		Admin  string `json:"admin"`
		Error  string `json:"error"`
		Status *struct {
			ServerID string        `json:"serverID"`
			Agents   []doctorAgent `json:"agents"`
		} `json:"status"`
	}
	var results []result
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		var one result
		if err2 := json.Unmarshal([]byte(out), &one); err2 != nil {
			t.Fatalf("konnect doctor status -o json: %v; output:\n%s", err, out)
		}
		results = []result{one}
	}
	got := map[string]map[string]doctorAgent{}
	for _, r := range results {
		if r.Error != "" || r.Status == nil {
			t.Fatalf("konnect doctor status: server %s: %q", r.Admin, r.Error)
		}
		agents := map[string]doctorAgent{}
		for _, a := range r.Status.Agents {
			agents[a.ID] = a
		}
		got[r.Status.ServerID] = agents
	}
	return got
}

// doctorAgents returns, per server ID, the sorted IDs of the connected
// agents that konnect doctor status reports.
func (c *cluster) doctorAgents(t *testing.T, adminPorts ...int) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	for server, agents := range c.doctorStatus(t, adminPorts...) {
		ids := []string{}
		for id, a := range agents {
			if a.Connected {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		got[server] = ids
	}
	return got
}

// pokeUntilAvailable waits for Available=True, nudging the availability
// controller so that the time measured is the tunnel's, not its resync's.
func (c *cluster) pokeUntilAvailable(ctx context.Context, timeout time.Duration) error {
	return harness.Poll("APIService "+apiServiceName+" Available=True", timeout, time.Second, func() error {
		if err := c.poke(ctx); err != nil {
			return err
		}
		return c.waitAPIService(ctx, "True", 2*time.Second)
	})
}

// poke changes an annotation of the APIService, which makes the availability controller check it at
// once instead of at its 30 s resync.
func (c *cluster) poke(ctx context.Context) error {
	_, err := c.kubectl(ctx, nsCP, "annotate", "--overwrite", "apiservice", apiServiceName, "e2e.konnect.dev/poke="+randHex(4))
	return err
}

// waitDoctor waits until konnect doctor status shows exactly want.
func (c *cluster) waitDoctor(t *testing.T, want map[string][]string, adminPorts ...int) {
	t.Helper()
	var got map[string][]string
	err := harness.Poll("konnect doctor status to list the agents", 30*time.Second, 500*time.Millisecond, func() error {
		got = c.doctorAgents(t, adminPorts...)
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("connected agents %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// doctorDial dials the pod address through server s's frontend socket with
// konnect doctor dial, as kube-apiserver would.
func (c *cluster) doctorDial(t *testing.T, s *tunnelServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	out, err := harness.Run(ctx, c.tp.ns(nsCP), bins.konnect, "doctor", "dial", net.JoinHostPort(podAddr, strconv.Itoa(podPort)),
		"--uds-name", s.uds, "--mode", c.mode.mode, "--timeout", "10s")
	if err != nil {
		t.Fatalf("konnect doctor dial through %s: %v\n%s", s.opts.id, err, out)
	}
}
