package daemon

import (
	"errors"
	"io"
	"net"
)

// Bound collects what a New binds, so that every New cleans up the same way and a daemon that never runs
// can be closed:
//
//	var b daemon.Bound
//	defer b.CloseIfFailed(&err)
type Bound struct{ closers []io.Closer }

// Listen is the package's Listen, with the listener added to b.
func (b *Bound) Listen(network, addr string, allowRemote bool, flagName string, allowFlag ...string) (net.Listener, error) {
	ln, err := Listen(network, addr, allowRemote, flagName, allowFlag...)
	if err != nil {
		return nil, err
	}
	b.Add(ln)
	return ln, nil
}

// Add adds something bound elsewhere (a Unix socket, a server's listeners).
func (b *Bound) Add(c io.Closer) { b.closers = append(b.closers, c) }

// Close closes everything added, the last first, and returns their errors.
func (b *Bound) Close() error {
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		if err := b.closers[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	b.closers = nil
	return errors.Join(errs...)
}

// CloseIfFailed closes everything added when *err is not nil: deferred in a New, nothing stays bound when it
// fails.
func (b *Bound) CloseIfFailed(err *error) {
	if *err != nil {
		_ = b.Close()
	}
}
