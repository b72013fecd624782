package tunnel

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestWrongModeIsNamed: dialling a server in the other --mode is explained as that, not as an unreachable
// server, and at once rather than when the dial times out.
func TestWrongModeIsNamed(t *testing.T) {
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run("server "+mode, func(t *testing.T) {
			e := newEnv(t)
			s := start(t, e.config(mode))
			other := map[string]string{"grpc": "http-connect", "http-connect": "grpc"}[mode]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := s.frontend(other).Dial(ctx, "127.0.0.1:80")
			if ctx.Err() != nil {
				t.Fatalf("dial with --mode %s waited for its timeout: %v", other, err)
			}
			var fe *FrontendError
			if !errors.As(err, &fe) || !errors.Is(err, ErrOtherMode) && !strings.Contains(err.Error(), "malformed HTTP response") {
				t.Fatalf("dial with --mode %s: %v, want a FrontendError for the other protocol", other, err)
			}
			// gRPC's own error here depends on a race; the probe after it does not.
			if other == "grpc" && !errors.Is(err, ErrOtherMode) {
				t.Fatalf("dial with --mode grpc: %v, want ErrOtherMode", err)
			}
		})
	}
}
