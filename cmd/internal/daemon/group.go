package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Group runs the parts of one daemon (its tunnel or proxy, SSH connection, health and admin endpoints)
// together, and is the one way the four daemons stop:
//
//   - Run starts every part, each with its own context;
//   - when ctx ends (a signal) or any part returns, whether with an error or not, every part is stopped;
//   - parts stop one at a time in reverse order of Add, so that what was added first (the health
//     endpoints) stops last and probes see readiness fail while the daemon drains;
//   - each stop is bounded: Run waits for a part at most StopTimeout after cancelling it (0: no bound), and
//     then reports it and goes on.
//
// The bound is on top of a part's own graceful timeout: a daemon sets StopTimeout above it.
type Group struct {
	StopTimeout time.Duration
	parts       []groupPart
}

type groupPart struct {
	name string
	run  func(context.Context) error
}

// Add registers a part. A non-empty name prefixes the part's error. run must return once its context ends.
func (g *Group) Add(name string, run func(ctx context.Context) error) {
	g.parts = append(g.parts, groupPart{name, run})
}

// Run runs the parts until ctx ends or one returns, stops them all, and returns every error the parts
// returned, in the order they came, or nil.
func (g *Group) Run(ctx context.Context) error {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(g.parts))
	cancels := make([]context.CancelFunc, len(g.parts))
	done := make([]bool, len(g.parts))
	for i, p := range g.parts {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx)) // the caller's values, but stopped by g alone
		cancels[i] = cancel
		go func() { results <- result{i, p.run(pctx)} }()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	var errs []error
	record := func(r result) {
		done[r.i] = true
		if r.err != nil {
			if n := g.parts[r.i].name; n != "" {
				r.err = fmt.Errorf("%s: %w", n, r.err)
			}
			errs = append(errs, r.err)
		}
	}
	if len(g.parts) == 0 {
		<-ctx.Done()
		return nil
	}
	select {
	case <-ctx.Done():
	case r := <-results:
		record(r)
	}
	for i := len(g.parts) - 1; i >= 0; i-- {
		cancels[i]()
		var timeout <-chan time.Time
		if g.StopTimeout > 0 {
			t := time.NewTimer(g.StopTimeout)
			defer t.Stop()
			timeout = t.C
		}
		for !done[i] {
			select {
			case r := <-results:
				record(r)
			case <-timeout:
				errs = append(errs, fmt.Errorf("%s: did not stop within %s", g.parts[i].name, g.StopTimeout))
				done[i] = true
			}
		}
	}
	return errors.Join(errs...)
}
