package tunnel

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

const (
	testAudience = "system:konnectivity-server"
	testAgentSA  = "system:serviceaccount:kube-system:konnectivity-agent"
)

// reviewer is a TokenReview endpoint for unit tests: it knows some tokens, answers after delay, and counts
// the reviews it gets and how many were in flight at once. The real kube-apiserver is test/reliability's.
type reviewer struct {
	mu          sync.Mutex
	users       map[string]string // token → username; unknown tokens are "invalid bearer token"
	nodes       map[string]string // token → the node-name extra of its review, when it has one
	delay       time.Duration
	gate        chan struct{} // when set, every review waits for it to close
	reviews     atomic.Int64
	inFlight    atomic.Int64
	maxInFlight atomic.Int64
}

func newReviewer() *reviewer {
	return &reviewer{users: map[string]string{}, nodes: map[string]string{}}
}

func (r *reviewer) add(token, user string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users[token] = user
}

func (r *reviewer) client() kubernetes.Interface {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authv1.TokenReview).DeepCopy()
		r.reviews.Add(1)
		n := r.inFlight.Add(1)
		defer r.inFlight.Add(-1)
		for {
			m := r.maxInFlight.Load()
			if n <= m || r.maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		r.mu.Lock()
		user, ok := r.users[tr.Spec.Token]
		node, bound := r.nodes[tr.Spec.Token]
		gate := r.gate
		r.mu.Unlock()
		if gate != nil {
			<-gate
		}
		time.Sleep(r.delay)
		if !ok || len(tr.Spec.Audiences) != 1 || tr.Spec.Audiences[0] != testAudience {
			tr.Status = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		} else {
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, User: authv1.UserInfo{Username: user}, Audiences: tr.Spec.Audiences}
			if bound {
				tr.Status.User.Extra = map[string]authv1.ExtraValue{nodeNameExtra: {node}}
			}
		}
		return true, tr, nil
	})
	return cs
}

// gaugeValue reads a gauge (counterValue, in stall_test.go, reads a counter).
func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

func newTestAuthenticator(t *testing.T, r *reviewer, mod func(*TokenAuth)) *tokenAuthenticator {
	t.Helper()
	m, err := newAuthMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	ta := TokenAuth{Namespace: "kube-system", ServiceAccount: "konnectivity-agent", Audience: testAudience, Client: r.client()}
	if mod != nil {
		mod(&ta)
	}
	return newTokenAuthenticator(ta, m)
}

func bearer(token string) metadata.MD {
	return metadata.Pairs(header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+token)
}

var (
	srcA = netip.MustParseAddr("192.0.2.1")
	srcB = netip.MustParseAddr("192.0.2.2")
)

// TestTokenAuthenticatorUpstreamSemantics: the checks and the error texts are upstream's
// authenticateAgentViaToken and validateAuthToken (v0.36.0), which agents show and docs list.
func TestTokenAuthenticatorUpstreamSemantics(t *testing.T) {
	r := newReviewer()
	r.add("good", testAgentSA)
	r.add("other-ns", "system:serviceaccount:default:konnectivity-agent")
	r.add("other-sa", "system:serviceaccount:kube-system:intruder")
	r.add("not-sa", "system:node:kube-system:w1")
	r.add("bad-format", "alice")
	a := newTestAuthenticator(t, r, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want string // "" means accepted
	}{
		{"good", bearer("good"), ""},
		{"no token", metadata.Pairs(header.AgentID, "x"), "Authentication context was not found in metadata"},
		{"two tokens", metadata.Pairs(header.AuthenticationTokenContextKey, "Bearer a", header.AuthenticationTokenContextKey, "Bearer b"), "too many (2) tokens are received"},
		{"no prefix", metadata.Pairs(header.AuthenticationTokenContextKey, "good"), `received token does not have "Bearer " prefix`},
		{"unknown", bearer("unknown"), "Failed to validate authentication token, err:lookup failed: invalid bearer token"},
		{"other namespace", bearer("other-ns"), `Failed to validate authentication token, err:lookup failed: incoming request from "default" namespace. Expected "kube-system"`},
		{"other service account", bearer("other-sa"), `Failed to validate authentication token, err:lookup failed: incoming request from "intruder" service account. Expected "konnectivity-agent"`},
		{"not a service account", bearer("not-sa"), "Failed to validate authentication token, err:lookup failed: username returned is not a service account"},
		{"bad username", bearer("bad-format"), "Failed to validate authentication token, err:lookup failed: unexpected username format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each from its own source, so that no source backs off.
			src := netip.AddrFrom4([4]byte{192, 0, 2, byte(len(tc.name))})
			err := a.authErr(ctx, tc.md, src)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && (err == nil || status.Convert(err).Message() != tc.want):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTokenAuthenticatorCache: a successful review is remembered for the TTL (or until the token's own
// expiry, if sooner), keyed by a hash, never the token; a rejection is answered from memory with the same
// error.
func TestTokenAuthenticatorCache(t *testing.T) {
	r := newReviewer()
	r.add("good", testAgentSA)
	exp := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	jwt := "e30." + base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d,"sub":"x"}`, exp.Unix()))) + ".sig"
	r.add(jwt, testAgentSA)
	a := newTestAuthenticator(t, r, func(ta *TokenAuth) { ta.CacheTTL = time.Minute })
	now := time.Date(2029, 12, 31, 23, 59, 50, 0, time.UTC) // 10 s before the JWT expires
	a.now = func() time.Time { return now }
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := a.authErr(ctx, bearer("good"), srcA); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.reviews.Load(); n != 1 {
		t.Fatalf("3 authentications of one token sent %d TokenReviews, want 1", n)
	}
	if hits := counterValue(a.m.cacheHits.WithLabelValues("authenticated")); hits != 2 {
		t.Errorf("cache hits %v, want 2", hits)
	}
	a.mu.Lock()
	for k := range a.good {
		if strings.Contains(string(k[:]), "good") {
			t.Error("the cache holds the token")
		}
	}
	a.mu.Unlock()
	now = now.Add(time.Minute + time.Second)
	if err := a.authErr(ctx, bearer("good"), srcA); err != nil {
		t.Fatal(err)
	}
	if n := r.reviews.Load(); n != 2 {
		t.Fatalf("after the TTL: %d TokenReviews, want 2", n)
	}

	// The JWT expires 10 s from now: remembered until then, not for the minute.
	now = exp.Add(-10 * time.Second)
	for _, after := range []time.Duration{0, 5 * time.Second, 11 * time.Second} {
		now = exp.Add(-10*time.Second + after)
		if err := a.authErr(ctx, bearer(jwt), srcA); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.reviews.Load(); n != 4 {
		t.Fatalf("a token past its exp was not reviewed again: %d TokenReviews, want 4", n)
	}

	// A rejection is remembered with its error.
	first := a.authErr(ctx, bearer("bogus"), srcA)
	again := a.authErr(ctx, bearer("bogus"), srcB)
	if first == nil || again == nil || first.Error() != again.Error() {
		t.Fatalf("rejections differ: %v / %v", first, again)
	}
	if n := r.reviews.Load(); n != 5 {
		t.Fatalf("a rejected token repeated at once was reviewed again: %d TokenReviews, want 5", n)
	}

	// A negative TTL turns the cache off.
	off := newTestAuthenticator(t, r, func(ta *TokenAuth) { ta.CacheTTL = -1 })
	before := r.reviews.Load()
	for i := 0; i < 2; i++ {
		if err := off.authErr(ctx, bearer("good"), srcA); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.reviews.Load() - before; n != 2 {
		t.Fatalf("without the cache: %d TokenReviews, want 2", n)
	}
}

// TestTokenAuthenticatorBacksOffSources: a source whose distinct tokens keep being rejected has further
// unknown tokens refused without a review for a while, doubling; a known token from it, and any token from
// another source, are not held back.
func TestTokenAuthenticatorBacksOffSources(t *testing.T) {
	r := newReviewer()
	r.add("good", testAgentSA)
	r.add("good-2", testAgentSA)
	a := newTestAuthenticator(t, r, nil)
	now := time.Now()
	a.now = func() time.Time { return now }
	ctx := context.Background()
	if err := a.authErr(ctx, bearer("good"), srcA); err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= freeRejections; i++ {
		if err := a.authErr(ctx, bearer(fmt.Sprintf("bogus-%d", i)), srcA); err == nil {
			t.Fatal("bogus token accepted")
		}
	}
	reviews := r.reviews.Load()
	if reviews != freeRejections+2 {
		t.Fatalf("%d TokenReviews, want %d", reviews, freeRejections+2)
	}
	err := a.authErr(ctx, bearer("bogus-next"), srcA)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rejected lately") {
		t.Fatalf("a source in backoff: %v", err)
	}
	if r.reviews.Load() != reviews {
		t.Fatal("a source in backoff got a TokenReview")
	}
	if err := a.authErr(ctx, bearer("good"), srcA); err != nil {
		t.Fatalf("a known token from a source in backoff: %v", err)
	}
	if err := a.authErr(ctx, bearer("good-2"), srcB); err != nil {
		t.Fatalf("another source: %v", err)
	}
	// After the pause, the next unknown token is reviewed; its rejection doubles the pause.
	now = now.Add(sourceFirst + time.Millisecond)
	if err := a.authErr(ctx, bearer("bogus-late"), srcA); err == nil || status.Code(err) == codes.Unavailable {
		t.Fatalf("after the pause: %v", err)
	}
	now = now.Add(sourceFirst + time.Millisecond)
	if err := a.authErr(ctx, bearer("bogus-later"), srcA); status.Code(err) != codes.Unavailable {
		t.Fatalf("the pause did not double: %v", err)
	}
	if got := counterValue(a.m.authRefused.WithLabelValues("source-backoff")); got != 2 {
		t.Errorf("source-backoff refusals counted %v, want 2", got)
	}
	// A quiet source is forgotten.
	now = now.Add(sourceForgetsIn + time.Second)
	if err := a.authErr(ctx, bearer("bogus-much-later"), srcA); status.Code(err) == codes.Unavailable {
		t.Fatalf("a quiet source still backs off: %v", err)
	}
}

// TestTokenAuthenticatorConcurrency: concurrent authentications of one token are one TokenReview, and no
// more than MaxConcurrentReviews are in flight however many agents arrive at once.
func TestTokenAuthenticatorConcurrency(t *testing.T) {
	r := newReviewer()
	r.delay = 20 * time.Millisecond
	for i := 0; i < 64; i++ {
		r.add(fmt.Sprintf("agent-%d", i), testAgentSA)
	}
	a := newTestAuthenticator(t, r, func(ta *TokenAuth) { ta.MaxConcurrentReviews = 4 })
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 128)
	for i := 0; i < 64; i++ {
		for j := 0; j < 2; j++ { // each token twice at once
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- a.authErr(ctx, bearer(fmt.Sprintf("agent-%d", i)), srcA)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := r.reviews.Load(); n != 64 {
		t.Errorf("128 authentications of 64 tokens sent %d TokenReviews, want 64", n)
	}
	if m := r.maxInFlight.Load(); m > 4 {
		t.Errorf("%d TokenReviews in flight at once, want at most 4", m)
	}
}

// TestTokenAuthenticatorAbandoned: a review that nobody waits for any more by the time a slot frees is not
// sent; one that started runs to its end, and its answer serves the agent's retry.
func TestTokenAuthenticatorAbandoned(t *testing.T) {
	r := newReviewer()
	r.add("slow", testAgentSA)
	r.add("queued", testAgentSA)
	r.gate = make(chan struct{})
	a := newTestAuthenticator(t, r, func(ta *TokenAuth) { ta.MaxConcurrentReviews = 1 })

	slowCtx, cancelSlow := context.WithCancel(context.Background())
	slowDone := make(chan error, 1)
	go func() { slowDone <- a.authErr(slowCtx, bearer("slow"), srcA) }()
	for r.reviews.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	queuedCtx, cancelQueued := context.WithCancel(context.Background())
	queuedDone := make(chan error, 1)
	go func() { queuedDone <- a.authErr(queuedCtx, bearer("queued"), srcA) }()
	for gaugeValue(a.m.reviewsWaiting) == 0 {
		time.Sleep(time.Millisecond)
	}
	// Both agents give up (their connections closed); the review in flight finishes, the queued one is
	// never sent.
	cancelSlow()
	cancelQueued()
	if err := <-slowDone; status.Code(err) != codes.Canceled {
		t.Fatalf("slow: %v", err)
	}
	if err := <-queuedDone; status.Code(err) != codes.Canceled {
		t.Fatalf("queued: %v", err)
	}
	r.mu.Lock()
	close(r.gate)
	r.gate = nil
	r.mu.Unlock()
	harness.EventuallyTrue(t, 5*time.Second, "the abandoned review counted", func() bool {
		return counterValue(a.m.authRefused.WithLabelValues("abandoned")) == 1
	})
	if n := r.reviews.Load(); n != 1 {
		t.Fatalf("%d TokenReviews, want 1 (the queued one was abandoned)", n)
	}
	// The slow one's answer was remembered: the agent's retry needs no review.
	harness.EventuallyTrue(t, 5*time.Second, "the slow review remembered", func() bool {
		return counterValue(a.m.reviews.WithLabelValues("authenticated")) == 1
	})
	if err := a.authErr(context.Background(), bearer("slow"), srcA); err != nil {
		t.Fatal(err)
	}
	if n := r.reviews.Load(); n != 1 {
		t.Fatalf("the retry sent a TokenReview (%d in all)", n)
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		if got := backoff(time.Second, 30*time.Second, n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestReadinessReviewsThroughItsOwnClient: /readyz's TokenReview goes through TokenAuth.ProbeClient, and
// agents' through Client, so that neither waits behind the other's rate limiter.
func TestReadinessReviewsThroughItsOwnClient(t *testing.T) {
	agents, probes := newReviewer(), newReviewer()
	agents.add("good", testAgentSA)
	e := newEnv(t)
	cfg := tokenConfig(e, agents)
	cfg.TokenAuth.ProbeClient = probes.client()
	s := start(t, cfg)
	for _, chk := range s.ReadyChecks() {
		if err := chk.Check(&http.Request{}); err != nil {
			t.Fatalf("readiness %s: %v", chk.Name(), err)
		}
	}
	connectAgent(t, e, s.AgentAddr(), "agent-1", grpc.WithPerRPCCredentials(tokenCreds("good")))
	if a, p := agents.reviews.Load(), probes.reviews.Load(); a != 1 || p != 1 {
		t.Fatalf("agents' client sent %d TokenReviews, the probe's %d; want 1 each", a, p)
	}
	if got := counterValue(s.authMetrics.readinessReview.WithLabelValues("ok")); got != 1 {
		t.Errorf("readiness reviews counted %v, want 1", got)
	}
}

// authErr is authenticate's error alone, for the tests that do not look at the node.
func (a *tokenAuthenticator) authErr(ctx context.Context, md metadata.MD, src netip.Addr) error {
	_, err := a.authenticate(ctx, md, src)
	return err
}
