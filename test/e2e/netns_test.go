//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
)

// Addresses of the simulated hosts. Everything is in 198.18.0.0/15, the
// range set aside for benchmark tests, and no namespace has a default route:
// a packet for anything else has nowhere to go.
const (
	cpAddr     = "198.18.0.1" // control plane, on the cp<->w1 link
	w1Addr     = "198.18.0.2"
	cpW2Addr   = "198.18.0.5" // cp's end of the cp<->w2 link
	w2Addr     = "198.18.0.6"
	cpLapAddr  = "198.18.1.1" // cp's end of the cp<->lap link; sshd listens here
	lapAddr    = "198.18.1.2"
	podAddr    = "198.19.0.10" // the "pod" on w1's lo; only w1 can reach it
	podPort    = 8443
	apiPort    = 6443
	serviceNet = "198.18.128.0/24" // --service-cluster-ip-range; never dialled
)

// Namespace roles.
const (
	nsCP  = "cp"
	nsW1  = "w1"
	nsW2  = "w2"
	nsLap = "lap"
)

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// topology is one set of network namespaces: cp, w1, w2 and lap.
type topology struct {
	prefix string            // e.g. kn1234-ab12-grpc
	names  map[string]string // role -> namespace name
}

func (tp *topology) ns(role string) string {
	n, ok := tp.names[role]
	if !ok {
		panic("unknown namespace role " + role)
	}
	return n
}

// newTopology creates the namespaces and links:
//
//	w1 198.18.0.2/30 ── 198.18.0.1/30 cp 198.18.0.5/30 ── 198.18.0.6/30 w2
//	                                   cp 198.18.1.1/30 ── 198.18.1.2/30 lap
//
// plus the pod address 198.19.0.10/32 on w1's lo. w2 gets one host route to
// 198.18.0.1 so that every agent dials the same server address. lap has no
// route to 198.18.0.0/30: it reaches the API server only through sshd.
func newTopology(tag string) (*topology, error) {
	tp := &topology{prefix: runID + "-" + tag, names: map[string]string{}}
	var names []string
	for _, role := range []string{nsCP, nsW1, nsW2, nsLap} {
		tp.names[role] = tp.prefix + "-" + role
		names = append(names, tp.names[role])
	}
	track("netns "+tp.prefix+"-*", func() { harness.DeleteNetns(names...) })
	cp, w1, w2, lap := tp.ns(nsCP), tp.ns(nsW1), tp.ns(nsW2), tp.ns(nsLap)
	err := harness.CreateNetns(names, []harness.Link{
		{A: cp, ADev: "to-w1", AAddr: cpAddr + "/30", B: w1, BDev: "to-cp", BAddr: w1Addr + "/30"},
		{A: cp, ADev: "to-w2", AAddr: cpW2Addr + "/30", B: w2, BDev: "to-cp", BAddr: w2Addr + "/30"},
		{A: cp, ADev: "to-lap", AAddr: cpLapAddr + "/30", B: lap, BDev: "to-cp", BAddr: lapAddr + "/30"},
	},
		[]string{"-n", w1, "addr", "add", podAddr + "/32", "dev", "lo"},
		[]string{"-n", w2, "route", "add", cpAddr + "/32", "dev", "to-cp"})
	if err != nil {
		return nil, err
	}
	return tp, nil
}

func (tp *topology) destroy() {
	if keepEnv {
		return
	}
	for _, n := range tp.names {
		harness.DeleteNetns(n)
	}
}

// sweepStale deletes namespaces and work dirs left by earlier runs whose
// test process is gone (KONNECT_E2E_KEEP=1 leaves live processes behind,
// and those namespaces and their work dirs are kept).
func sweepStale() {
	harness.SweepNetns(staleNS)
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kn-e2e-kn*-*"))
	for _, d := range dirs {
		m := staleWorkDir.FindStringSubmatch(filepath.Base(d))
		if m == nil || !harness.Gone(m[2]) {
			continue
		}
		if kept, _ := filepath.Glob(filepath.Join("/run/netns", m[1]+"-*")); len(kept) > 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "e2e: removing stale work dir %s\n", d)
		_ = os.RemoveAll(d)
	}
}

var staleNS = regexp.MustCompile(`^kn(\d+)-[0-9a-f]{4}-`)

var staleWorkDir = regexp.MustCompile(`^kn-e2e-(kn(\d+)-[0-9a-f]{4})-\d+$`)

// expectUnreachable checks that a direct TCP dial from ns to addr fails with
// "network is unreachable": there is no route, so any success elsewhere in
// the test went through the tunnel.
func expectUnreachable(ns, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := harness.DialIn(ctx, ns, addr)
	if err == nil {
		c.Close()
		return fmt.Errorf("direct dial from %s to %s succeeded; the tunnel is not the only path", ns, addr)
	}
	if !errors.Is(err, syscall.ENETUNREACH) {
		return fmt.Errorf("direct dial from %s to %s: want ENETUNREACH, got %w", ns, addr, err)
	}
	return nil
}
