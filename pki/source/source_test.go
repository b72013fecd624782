package source

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}, "10.1.2.3"}, // IPv4-mapped counts as IPv4
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}, "2001:db8:1:2::"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 6}, "2001:db8:1:2::"}, // same /64
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 5}, "::"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "invalid IP"},
	} {
		if got := Of(tc.addr).String(); got != tc.want {
			t.Errorf("Of(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}

func TestCounter(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	c := &Counter{Max: 2}
	if !c.Take(a) || !c.Take(a) {
		t.Fatal("a source within its bound was refused")
	}
	if c.Take(a) {
		t.Fatal("a third connection from a source bounded at two was counted")
	}
	if !c.Take(b) {
		t.Fatal("another source was refused for the first one's connections")
	}
	c.Release(a)
	if !c.Take(a) {
		t.Fatal("a released connection did not free its source's slot")
	}
	c.Release(a)
	c.Release(a)
	c.Release(b)
	if len(c.open) != 0 {
		t.Fatalf("sources that hold nothing are remembered: %v", c.open)
	}

	var unbounded Counter
	for range 1000 {
		if !unbounded.Take(a) {
			t.Fatal("the zero Counter refused a connection")
		}
	}
}

func TestCounterConcurrent(t *testing.T) {
	src := netip.MustParseAddr("10.0.0.1")
	c := &Counter{Max: 10}
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.Take(src) {
				mu.Lock()
				taken++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if taken != 10 {
		t.Fatalf("%d of 100 concurrent connections counted, want the bound, 10", taken)
	}
}

// TestRefuseResets: the peer of a refused TCP connection sees a reset, not an orderly close.
func TestRefuseResets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			Refuse(c)
		}
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err == nil { // the reset may come before the dial returns
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a refused connection: %v, want a reset", err)
	}
}

func TestPenalties(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	now := time.Unix(1000, 0)
	p := &Penalties{Per: 10 * time.Second, Threshold: 15 * time.Second, Max: 600 * time.Second}
	if p.Add(a, now) || p.Refused(a, now) {
		t.Fatal("one lapsed connection kept its source out")
	}
	if !p.Add(a, now.Add(time.Second)) || !p.Refused(a, now.Add(time.Second)) {
		t.Fatal("two lapsed connections in a row did not keep their source out")
	}
	if p.Refused(b, now) {
		t.Fatal("another source was refused")
	}
	// A penalty until t+20: refused while more than 15 s of it remain, then admitted, then forgotten.
	if !p.Refused(a, now.Add(4*time.Second)) || p.Refused(a, now.Add(6*time.Second)) {
		t.Fatal("the penalty did not run out when its time above the threshold did")
	}
	if p.Refused(a, now.Add(30*time.Second)); len(p.until) != 0 {
		t.Fatalf("an expired penalty is remembered: %v", p.until)
	}
	for range 1000 {
		p.Add(a, now)
	}
	if !p.Refused(a, now.Add(580*time.Second)) || p.Refused(a, now.Add(590*time.Second)) {
		t.Fatal("a penalty grew past Max")
	}

	// Full: a new source goes unpenalized until a remembered one expires.
	full := &Penalties{Per: 10 * time.Second, Threshold: 5 * time.Second, Max: time.Minute, MaxSources: 1}
	full.Add(a, now)
	if full.Add(b, now) || full.Refused(b, now) {
		t.Fatal("a source past MaxSources was penalized")
	}
	if !full.Add(b, now.Add(11*time.Second)) {
		t.Fatal("a source was not penalized once the remembered one expired")
	}

	var zero Penalties
	if zero.Refused(a, now) {
		t.Fatal("the zero Penalties refused a source")
	}

	// MaxSources 0 remembers DefaultPenaltySources, OpenSSH's 65,536, as docs/reliability.md says.
	dflt := &Penalties{Per: 10 * time.Second, Threshold: 5 * time.Second, Max: time.Minute}
	base := netip.MustParseAddr("10.0.0.0").As4()
	for i := range 65536 {
		ip := base
		ip[2], ip[3] = byte(i>>8), byte(i)
		if !dflt.Add(netip.AddrFrom4(ip), now) {
			t.Fatalf("source %d of 65,536 was not penalized", i+1)
		}
	}
	if dflt.Add(netip.MustParseAddr("10.1.0.0"), now) {
		t.Fatal("a source past 65,536 remembered ones was penalized")
	}
}
