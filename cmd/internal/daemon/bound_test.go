package daemon

import (
	"errors"
	"net"
	"testing"
)

// A New that fails releases everything it bound, through one deferred call; one that succeeds keeps it all.
func TestBoundClosesOnlyOnFailure(t *testing.T) {
	newDaemon := func(fail bool) (b *Bound, lns []net.Listener, err error) {
		b = &Bound{}
		defer b.CloseIfFailed(&err)
		for range 2 {
			ln, err := b.Listen("tcp", "127.0.0.1:0", false, "--listen")
			if err != nil {
				return nil, nil, err
			}
			lns = append(lns, ln)
		}
		if fail {
			return b, lns, errors.New("boom")
		}
		return b, lns, nil
	}
	isOpen := func(ln net.Listener) bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err == nil
	}

	_, lns, _ := newDaemon(true)
	for _, ln := range lns {
		if isOpen(ln) {
			t.Errorf("%s still bound after New failed", ln.Addr())
		}
	}
	b, lns, err := newDaemon(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range lns {
		if !isOpen(ln) {
			t.Errorf("%s closed although New succeeded", ln.Addr())
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ln := range lns {
		if isOpen(ln) {
			t.Errorf("%s still bound after Close", ln.Addr())
		}
	}
	if _, err := b.Listen("tcp", "0.0.0.0:0", false, "--listen"); err == nil {
		t.Error("Bound.Listen took a remote address without allowRemote")
	}
}
