package daemon

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/klog/v2"
)

// Daemon is what a command's New returns: every listener bound, nothing started.
type Daemon interface {
	// Run serves until ctx ends, then stops within the daemon's graceful timeout; nil after a stop that ctx
	// asked for. It starts everything the daemon runs, watches and informers included.
	Run(ctx context.Context) error
	// Close releases what New bound, for a daemon that never runs (a New that fails releases itself).
	Close() error
	// Startup says where the daemon serves. RunCommand, and nothing else, reports it.
	Startup() Startup
}

// Startup is what RunCommand reports once New has bound everything.
type Startup struct {
	// Line, if any, goes to the command's standard output, which scripts read: "konnect server: frontend
	// ...", or kubectl proxy's "Starting to serve on ADDR".
	Line string
	// KV are the key/value pairs of the one klog line "Serving": "health", addr, "admin", addr, ...
	KV []any
	// Ready, when set, holds "Serving" back until it first returns nil (konnect socks: the first SSH
	// connection is up), so that a refused key or host key does not show "Serving" and then an error. Until
	// then the line Waiting ("Listening; connecting to the SSH server"), with the same KV, is logged.
	Ready   func() error
	Waiting string
}

// readyPoll is how often RunCommand asks Startup.Ready until it is ready.
const readyPoll = 50 * time.Millisecond

// RunCommand is every daemon command's run, the contract in four steps: config validates the flags
// (Options.Config), newDaemon binds every listener (New), given the context that SIGINT and SIGTERM end, so
// that a start that waits (konnect socks's Match exec commands) stops with them; the daemon's Startup is
// reported (Line on out, KV in one klog line, "Serving", held back until Startup.Ready says so), and the
// daemon runs until ctx ends or SIGINT/SIGTERM arrives. Once it has run a while, the memory only its
// start-up needed is given back (pageout.go). Signals are caught from the start: one that arrives while New
// binds ends Run at once, which releases what New bound (a socket file, say).
func RunCommand[C any, D Daemon](ctx context.Context, out io.Writer, config func() (C, error),
	newDaemon func(context.Context, C) (D, error)) error {
	ctx, cancel := SignalContext(ctx)
	defer cancel()
	cfg, err := config()
	if err != nil {
		return err
	}
	d, err := newDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	st := d.Startup()
	if st.Line != "" {
		fmt.Fprintln(out, st.Line)
	}
	if st.Ready == nil {
		klog.InfoS("Serving", st.KV...)
	} else {
		klog.InfoS(st.Waiting, st.KV...)
		done := make(chan struct{})
		defer func() {
			cancel()
			<-done
		}()
		go func() {
			defer close(done)
			logServingOnceReady(ctx, st)
		}()
	}
	go releaseStartupPagesLater(ctx)
	return d.Run(ctx)
}

// logServingOnceReady logs "Serving" once st.Ready returns nil, unless ctx ends first.
func logServingOnceReady(ctx context.Context, st Startup) {
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for st.Ready() != nil {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	klog.InfoS("Serving", st.KV...)
}
