package interrupt

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// reset forgets what earlier tests registered or ran.
func reset() {
	mu.Lock()
	undos, next, interrupted = map[int]func(){}, 0, false
	mu.Unlock()
}

// TestRunUndoesNewestFirst: Run runs what is still registered, newest first, not what was done; a later
// Undo does not return.
func TestRunUndoesNewestFirst(t *testing.T) {
	reset()
	defer reset()
	var ran []string
	Undo(func() { ran = append(ran, "lock") })
	done := Undo(func() { ran = append(ran, "finished write") })
	Undo(func() { ran = append(ran, "write in flight") })
	done()
	Run()
	if want := []string{"write in flight", "lock"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	Run()
	if len(ran) != 2 {
		t.Fatalf("a second Run ran %v again", ran[2:])
	}
	returned := make(chan struct{})
	go func() {
		Undo(func() {})
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("Undo returned after the interruption: its caller would go on to make what nobody undoes")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestCatchRunsUndosAndExits: a process that catches SIGINT runs its undos and exits 130, as the shell
// reports a process the signal killed; after Stop the signal takes its default course.
func TestCatchRunsUndosAndExits(t *testing.T) {
	if marker := os.Getenv("KONNECT_INTERRUPT_MARKER"); marker != "" {
		Catch()
		if os.Getenv("KONNECT_INTERRUPT_STOP") != "" {
			Stop()
		}
		Undo(func() { os.Remove(marker) })
		os.WriteFile(marker+".ready", nil, 0o600)
		time.Sleep(time.Minute)
		os.Exit(3)
	}
	for _, stop := range []bool{false, true} {
		marker := filepath.Join(t.TempDir(), "marker")
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCatchRunsUndosAndExits$")
		cmd.Env = append(os.Environ(), "KONNECT_INTERRUPT_MARKER="+marker)
		if stop {
			cmd.Env = append(cmd.Env, "KONNECT_INTERRUPT_STOP=1")
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(marker + ".ready"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatal("the child never got ready")
			}
		}
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		ee, _ := err.(*exec.ExitError)
		_, statErr := os.Stat(marker)
		if stop {
			if ee == nil || !ee.Sys().(syscall.WaitStatus).Signaled() || statErr != nil {
				t.Errorf("after Stop: SIGINT ended the child with %v, marker %v; want killed by the signal, the undo not run", err, statErr)
			}
			continue
		}
		if ee == nil || ee.ExitCode() != 130 {
			t.Errorf("SIGINT ended the child with %v, want exit status 130", err)
		}
		if statErr == nil {
			t.Error("the undo did not run")
		}
	}
}
