package tunnel

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// Defaults for agent token authentication (see tokenAuthenticator).
const (
	// DefaultTokenReviewCacheTTL is how long a successful review is remembered. kube-apiserver remembers a
	// successful token authentication for 10 s too.
	DefaultTokenReviewCacheTTL = 10 * time.Second
	// DefaultMaxConcurrentReviews bounds the TokenReviews in flight for agents. The rest wait their turn,
	// first come first served, so a storm of reconnecting agents goes as fast as kube-apiserver answers
	// without a client-side rate limit (client-go's default, 5 per second, made 5,000 agents wait 17 minutes).
	DefaultMaxConcurrentReviews = 32

	// reviewTimeout bounds one TokenReview. A review runs to its end even when the agent that asked has gone,
	// so that its retry finds the answer cached.
	reviewTimeout = 10 * time.Second
	// A token that kube-apiserver rejected is answered from memory with the same error, for 1 s after the
	// first rejection and twice as long after each further one, up to 30 s.
	rejectedFirst = time.Second
	rejectedMax   = 30 * time.Second
	// A source whose tokens were rejected freeRejections times has further unknown tokens reviewed only
	// after a pause: 1 s after the next rejection, doubling up to 30 s; a minute without rejections forgets
	// it. Known tokens (cached) are never held back, so an agent that shares its address with a broken or
	// hostile one still gets in once its token has been reviewed.
	freeRejections  = 5
	sourceFirst     = time.Second
	sourceMax       = 30 * time.Second
	sourceForgetsIn = 2 * sourceMax
	// Bounds on what is remembered, against floods of distinct tokens or addresses.
	maxGoodTokens = 1 << 16
	maxBadTokens  = 1 << 12
	maxSources    = 1 << 12
)

type tokenKey [sha256.Size]byte

// tokenAuthenticator checks agents' ServiceAccount tokens with TokenReviews, as upstream's ProxyServer does
// (same checks, same errors), but bounded: successful reviews are cached for a short time by the token's
// SHA-256 (never the token), concurrent reviews of one token are one review, at most maxConcurrent are in
// flight, rejected tokens and sources that keep sending them are held back, and every step is counted.
type tokenAuthenticator struct {
	cfg TokenAuth
	ttl time.Duration
	sem chan struct{}
	m   *authMetrics
	now func() time.Time

	mu      sync.Mutex
	good    map[tokenKey]goodToken
	bad     map[tokenKey]*rejectedToken
	calls   map[tokenKey]*reviewCall
	sources map[netip.Addr]*sourceRejections
}

// goodToken is a successful review, remembered until until.
type goodToken struct {
	until time.Time
	node  string // the node of the pod the token is bound to, when kube-apiserver says (see nodeNameExtra)
}

// nodeNameExtra is the extra that kube-apiserver (1.30 and later) puts in the TokenReview of a token bound
// to a pod that runs on a node, as kubelet's projected tokens are: the node's name.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

type rejectedToken struct {
	err        error
	until      time.Time
	rejections int
}

type sourceRejections struct {
	rejections int
	last       time.Time
	until      time.Time
}

// reviewCall is one TokenReview that any number of streams with the same token wait for.
type reviewCall struct {
	done      chan struct{}
	abandoned chan struct{} // closed when every waiter left before the review started
	waiters   int
	started   bool
	sources   map[netip.Addr]bool
	agentID   string // of the stream that asked first, for the log
	err       error
	rejected  bool   // err is kube-apiserver's verdict on the token, not a failure to ask
	node      string // see goodToken
}

func newTokenAuthenticator(cfg TokenAuth, m *authMetrics) *tokenAuthenticator {
	ttl := cfg.CacheTTL
	if ttl == 0 {
		ttl = DefaultTokenReviewCacheTTL
	}
	n := cfg.MaxConcurrentReviews
	if n <= 0 {
		n = DefaultMaxConcurrentReviews
	}
	return &tokenAuthenticator{cfg: cfg, ttl: ttl, sem: make(chan struct{}, n), m: m, now: time.Now,
		good: map[tokenKey]goodToken{}, bad: map[tokenKey]*rejectedToken{}, calls: map[tokenKey]*reviewCall{},
		sources: map[netip.Addr]*sourceRejections{}}
}

// authenticate checks the token in an agent's Connect metadata; src is the agent's source (source.Of). node
// is the name of the node the token's pod runs on, "" when kube-apiserver did not say.
func (a *tokenAuthenticator) authenticate(ctx context.Context, md metadata.MD, src netip.Addr) (node string, err error) {
	token, err := bearerToken(md)
	if err != nil {
		a.m.authRefused.WithLabelValues("no-token").Inc()
		return "", err
	}
	key := tokenKey(sha256.Sum256([]byte(token)))
	now := a.now()
	a.mu.Lock()
	if g, ok := a.good[key]; ok && now.Before(g.until) {
		a.mu.Unlock()
		a.m.cacheHits.WithLabelValues("authenticated").Inc()
		return g.node, nil
	}
	if b, ok := a.bad[key]; ok && now.Before(b.until) {
		a.mu.Unlock()
		a.m.cacheHits.WithLabelValues("rejected").Inc()
		return "", b.err
	}
	call := a.calls[key]
	if call == nil {
		if s := a.sources[src]; s != nil && now.Before(s.until) {
			a.mu.Unlock()
			a.m.authRefused.WithLabelValues("source-backoff").Inc()
			return "", status.Errorf(codes.Unavailable, "%d tokens from %s were rejected lately; the next is reviewed in %s",
				s.rejections, src, s.until.Sub(now).Round(100*time.Millisecond))
		}
		call = &reviewCall{done: make(chan struct{}), abandoned: make(chan struct{}), sources: map[netip.Addr]bool{},
			agentID: first(md.Get(header.AgentID))}
		a.calls[key] = call
		go a.review(key, token, call)
	}
	call.waiters++
	call.sources[src] = true
	a.mu.Unlock()

	select {
	case <-call.done:
		return call.node, call.err
	case <-ctx.Done():
		a.mu.Lock()
		if call.waiters--; call.waiters == 0 && !call.started {
			close(call.abandoned)
			delete(a.calls, key)
		}
		a.mu.Unlock()
		return "", status.FromContextError(ctx.Err()).Err()
	}
}

// review sends call's TokenReview once a slot is free, unless every waiter has left by then.
func (a *tokenAuthenticator) review(key tokenKey, token string, call *reviewCall) {
	a.m.reviewsWaiting.Inc()
	select {
	case a.sem <- struct{}{}:
		a.m.reviewsWaiting.Dec()
	case <-call.abandoned:
		a.m.reviewsWaiting.Dec()
		a.m.authRefused.WithLabelValues("abandoned").Inc()
		return
	}
	defer func() { <-a.sem }()
	a.mu.Lock()
	if call.waiters == 0 { // the last waiter left as the slot came free
		a.mu.Unlock()
		a.m.authRefused.WithLabelValues("abandoned").Inc()
		return
	}
	call.started = true
	a.mu.Unlock()

	a.m.reviewsInFlight.Inc()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
	username, node, rejected, err := a.validate(ctx, token)
	cancel()
	a.m.reviewDuration.Observe(time.Since(start).Seconds())
	a.m.reviewsInFlight.Dec()
	result := "authenticated"
	switch {
	case rejected:
		result = "rejected"
	case err != nil:
		result = "error"
	}
	a.m.reviews.WithLabelValues(result).Inc()
	if err != nil {
		// Upstream's wording, which agents show and docs/reliability.md lists.
		err = fmt.Errorf("Failed to validate authentication token, err:%v", err) //nolint:staticcheck // upstream's message
	}

	now := a.now()
	a.mu.Lock()
	delete(a.calls, key)
	switch {
	case err == nil:
		a.remember(key, token, node, now)
		klog.V(5).InfoS("Agent successfully authenticated via token", "username", username, "node", node)
	case rejected:
		a.reject(key, err, now)
		for src := range call.sources {
			a.blame(src, now)
		}
	}
	call.err, call.rejected, call.node = err, rejected, node
	a.mu.Unlock()
	if err != nil {
		klog.ErrorS(err, "Client authentication failed", "agentID", call.agentID, "sources", sourceList(call.sources))
	}
	close(call.done)
}

// validate is upstream's validateAuthToken: a TokenReview for the server's audience, whose user must be the
// configured ServiceAccount. rejected tells kube-apiserver's verdict from a failure to get one. node is the
// token's pod's node (nodeNameExtra), "" when the review names none.
func (a *tokenAuthenticator) validate(ctx context.Context, token string) (username, node string, rejected bool, err error) {
	r, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{a.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", "", false, fmt.Errorf("Failed to authenticate request. err:%v", err) //nolint:staticcheck // upstream's message
	}
	if r.Status.Error != "" {
		return "", "", true, fmt.Errorf("lookup failed: %s", r.Status.Error)
	}
	if !r.Status.Authenticated {
		return "", "", true, errors.New("lookup failed: service account jwt not valid")
	}
	// The username is system:serviceaccount:NAMESPACE:NAME.
	username = r.Status.User.Username
	parts := strings.Split(username, ":")
	if len(parts) != 4 {
		return "", "", true, errors.New("lookup failed: unexpected username format")
	}
	if parts[0] != "system" || parts[1] != "serviceaccount" {
		return "", "", true, errors.New("lookup failed: username returned is not a service account")
	}
	if ns := parts[2]; ns != a.cfg.Namespace {
		return "", "", true, fmt.Errorf("lookup failed: incoming request from %q namespace. Expected %q", ns, a.cfg.Namespace)
	}
	if sa := parts[3]; sa != a.cfg.ServiceAccount {
		return "", "", true, fmt.Errorf("lookup failed: incoming request from %q service account. Expected %q", sa, a.cfg.ServiceAccount)
	}
	if v := r.Status.User.Extra[nodeNameExtra]; len(v) == 1 {
		node = v[0]
	}
	return username, node, false, nil
}

// bearerToken is upstream's reading of the token from a Connect stream's metadata, with its errors.
func bearerToken(md metadata.MD) (string, error) {
	if md == nil {
		return "", errors.New("Failed to retrieve metadata from context") //nolint:staticcheck // upstream's message
	}
	vals := md.Get(header.AuthenticationTokenContextKey)
	if len(vals) == 0 {
		return "", errors.New("Authentication context was not found in metadata") //nolint:staticcheck // upstream's message
	}
	if len(vals) > 1 {
		return "", fmt.Errorf("too many (%d) tokens are received", len(vals))
	}
	if !strings.HasPrefix(vals[0], header.AuthenticationTokenContextSchemePrefix) {
		return "", fmt.Errorf("received token does not have %q prefix", header.AuthenticationTokenContextSchemePrefix)
	}
	return strings.TrimPrefix(vals[0], header.AuthenticationTokenContextSchemePrefix), nil
}

// remember caches a successful review for the TTL, or until the token expires if that is sooner (its JWT
// exp claim, read without verifying it: kube-apiserver did that). The caller holds a.mu.
func (a *tokenAuthenticator) remember(key tokenKey, token, node string, now time.Time) {
	if a.ttl < 0 {
		return
	}
	until := now.Add(a.ttl)
	if exp, ok := jwtExpiry(token); ok && exp.Before(until) {
		until = exp
	}
	if len(a.good) >= maxGoodTokens {
		for k, g := range a.good {
			if !now.Before(g.until) {
				delete(a.good, k)
			}
		}
		if len(a.good) >= maxGoodTokens {
			return
		}
	}
	a.good[key] = goodToken{until: until, node: node}
	delete(a.bad, key)
}

// reject remembers a rejected token. The caller holds a.mu.
func (a *tokenAuthenticator) reject(key tokenKey, err error, now time.Time) {
	b := a.bad[key]
	if b == nil {
		if len(a.bad) >= maxBadTokens {
			for k, v := range a.bad {
				if now.After(v.until.Add(rejectedMax)) {
					delete(a.bad, k)
				}
			}
			if len(a.bad) >= maxBadTokens {
				return
			}
		}
		b = &rejectedToken{}
		a.bad[key] = b
	}
	b.rejections++
	b.err = err
	b.until = now.Add(backoff(rejectedFirst, rejectedMax, b.rejections-1))
}

// blame counts a rejected token against its source. The caller holds a.mu.
func (a *tokenAuthenticator) blame(src netip.Addr, now time.Time) {
	s := a.sources[src]
	if s != nil && now.Sub(s.last) > sourceForgetsIn {
		s = nil
	}
	if s == nil {
		if len(a.sources) >= maxSources {
			for k, v := range a.sources {
				if now.Sub(v.last) > sourceForgetsIn {
					delete(a.sources, k)
				}
			}
			if len(a.sources) >= maxSources {
				return
			}
		}
		s = &sourceRejections{}
		a.sources[src] = s
	}
	s.rejections++
	s.last = now
	if s.rejections > freeRejections {
		s.until = now.Add(backoff(sourceFirst, sourceMax, s.rejections-freeRejections-1))
	}
}

// backoff is first doubled n times, at most max.
func backoff(first, max time.Duration, n int) time.Duration {
	d := first
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// jwtExpiry reads the exp claim of a JWT without verifying it.
func jwtExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	sec, err := claims.Exp.Int64()
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

func sourceList(srcs map[netip.Addr]bool) []string {
	out := make([]string, 0, len(srcs))
	for s := range srcs {
		out = append(out, s.String())
	}
	return out
}
