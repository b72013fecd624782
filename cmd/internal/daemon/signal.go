package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/konnect-dev/konnect/pki/interrupt"
)

// SignalContext returns a context that is cancelled on the first SIGINT or SIGTERM. A second signal exits the
// process at once with status 1, for an operator who does not want to wait for a graceful drain.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background() // a command run with Execute rather than ExecuteContext
	}
	interrupt.Stop() // a daemon drains instead of exiting at once
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{}) // closed by the returned cancel: no second signal is awaited any more
	go func() {
		select {
		case sig := <-ch:
			fmt.Fprintf(os.Stderr, "received %s, shutting down (send it again to exit at once)\n", sig)
			cancel()
		case <-ctx.Done():
			signal.Stop(ch)
			return
		}
		select {
		case <-ch:
			os.Exit(1)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
		cancel()
	}
}
