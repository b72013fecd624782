package harness

import (
	"errors"
	"testing"
	"time"
)

// Eventually polls cond (see Poll) until it returns nil, and fails the test if timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(what, timeout, 20*time.Millisecond, cond); err != nil {
		t.Fatal(err)
	}
}

// EventuallyTrue is Eventually for a condition with no error to tell.
func EventuallyTrue(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
}
