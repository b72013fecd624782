// Package interrupt undoes what a one-shot command has half done when it is interrupted: the temporary file
// of a write in flight, the lock it holds. Go's default for SIGINT, SIGTERM and SIGHUP ends the process at
// once and leaves both behind, and a temporary file beside a key holds key material.
//
// The daemons do not use it: they stop gracefully on those signals (cmd/internal/daemon).
package interrupt

import (
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
)

var (
	mu          sync.Mutex
	undos       = map[int]func(){}
	next        int
	interrupted bool
)

// Undo registers f to run if the command is interrupted before done is called. The caller registers
// before it makes what f undoes, and makes it under a lock that f takes too, so that f never runs between
// the two. After an interruption Undo does not return: the process is on its way out, and its caller must
// not go on to make anything more.
func Undo(f func()) (done func()) {
	mu.Lock()
	if interrupted {
		mu.Unlock()
		select {}
	}
	id := next
	next++
	undos[id] = f
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(undos, id)
		mu.Unlock()
	}
}

var stopCatch func() // under mu

// Catch makes SIGINT, SIGTERM and SIGHUP run what is registered, newest first, and then end the process
// with status 128 + the signal's number, as a shell reports a process the signal killed. main calls it for
// every command; a daemon, which stops gracefully on those signals, calls Stop first.
func Catch() {
	mu.Lock()
	defer mu.Unlock()
	if stopCatch != nil {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			Run()
			code := 1
			if s, ok := sig.(syscall.Signal); ok {
				code = 128 + int(s)
			}
			os.Exit(code)
		case <-quit:
		}
	}()
	stopCatch = func() {
		signal.Stop(ch)
		close(quit)
	}
}

// Stop gives the signals back to their default, or to whoever else asked for them.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if stopCatch != nil {
		stopCatch()
		stopCatch = nil
	}
}

// Run runs what is registered, newest first; a later Undo blocks. Catch calls it, and then ends the
// process.
func Run() {
	mu.Lock()
	interrupted = true
	ids := make([]int, 0, len(undos))
	for id := range undos {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	fs := make([]func(), 0, len(ids))
	for _, id := range slices.Backward(ids) {
		fs = append(fs, undos[id])
		delete(undos, id)
	}
	mu.Unlock()
	for _, f := range fs {
		f()
	}
}
