package daemon

import "context"

// RunCommand is every daemon command's run, the contract in four steps: config validates the flags
// (Options.Config), newDaemon binds every listener (New), started prints the start-up line or tunes the
// process, and the daemon runs until ctx ends or SIGINT/SIGTERM arrives. Once it has run a while, the
// memory only its start-up needed is given back (pageout.go). Signals are caught from the start:
// one that arrives while New binds ends Run at once, which releases what New bound (a socket file, say).
func RunCommand[C any, D interface{ Run(context.Context) error }](ctx context.Context, config func() (C, error),
	newDaemon func(C) (D, error), started func(D)) error {
	ctx, cancel := SignalContext(ctx)
	defer cancel()
	cfg, err := config()
	if err != nil {
		return err
	}
	d, err := newDaemon(cfg)
	if err != nil {
		return err
	}
	if started != nil {
		started(d)
	}
	go releaseStartupPagesLater(ctx)
	return d.Run(ctx)
}
