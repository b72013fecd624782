package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestGroup(t *testing.T) {
	t.Run("signal stops all in reverse order", func(t *testing.T) {
		var mu sync.Mutex
		var stopped []string
		var g Group
		for _, n := range []string{"health", "ssh", "proxy"} {
			g.Add(n, func(ctx context.Context) error {
				<-ctx.Done()
				mu.Lock()
				stopped = append(stopped, n)
				mu.Unlock()
				return nil
			})
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		if err := g.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(stopped, " "); got != "proxy ssh health" {
			t.Errorf("stop order %q", got)
		}
	})
	t.Run("first error stops the others and is named", func(t *testing.T) {
		boom := errors.New("boom")
		var g Group
		g.Add("health", func(ctx context.Context) error { <-ctx.Done(); return nil })
		g.Add("ssh", func(context.Context) error { return boom })
		err := g.Run(context.Background())
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "ssh: boom") {
			t.Fatalf("Run() = %v", err)
		}
	})
	t.Run("stop is bounded", func(t *testing.T) {
		g := Group{StopTimeout: 50 * time.Millisecond}
		release := make(chan struct{})
		defer close(release)
		g.Add("stuck", func(context.Context) error { <-release; return nil })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := g.Run(ctx); err == nil || !strings.Contains(err.Error(), "stuck: did not stop") {
			t.Fatalf("Run() = %v", err)
		}
	})
}

// A part's context carries the caller's values (a logger, a trace ID) but is stopped by the Group alone, one
// part at a time.
func TestGroupPartsSeeCallerValues(t *testing.T) {
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "caller"))
	var g Group
	got := make(chan any, 1)
	g.Add("part", func(ctx context.Context) error {
		got <- ctx.Value(key{})
		<-ctx.Done()
		return nil
	})
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "caller" {
		t.Errorf("a part's context has value %v, want the caller's %q", v, "caller")
	}
}
