package flow

import (
	"context"
	"errors"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// TestWindowBoundsTheSender: a sender may have exactly what it was granted in flight, and a byte more is a
// violation.
func TestWindowBoundsTheSender(t *testing.T) {
	w := NewWindow(64<<10, 1<<20, nil)
	if err := w.Receive(64 << 10); err != nil {
		t.Fatalf("the initial window: %v", err)
	}
	if err := w.Receive(1); !errors.Is(err, ErrWindowExceeded) {
		t.Fatalf("a byte past the window: %v", err)
	}
}

// TestWindowGrantsAsConsumed: nothing is granted for less than a quarter of the window, and what is
// withheld is granted with the next grant, so that granted minus consumed is the window again.
func TestWindowGrantsAsConsumed(t *testing.T) {
	w := NewWindow(64<<10, 64<<10, nil) // no growth
	if err := w.Receive(40 << 10); err != nil {
		t.Fatal(err)
	}
	if g := w.Consume(10 << 10); g != 0 {
		t.Fatalf("granted %d for 10 KiB of a 64 KiB window", g)
	}
	if g := w.Consume(10 << 10); g != 20<<10 {
		t.Fatalf("granted %d after 20 KiB consumed, want 20 KiB", g)
	}
	// The sender may now send the rest of its window and the grant, and not a byte more.
	if err := w.Receive(64<<10 - 40<<10 + 20<<10); err != nil {
		t.Fatal(err)
	}
	if err := w.Receive(1); !errors.Is(err, ErrWindowExceeded) {
		t.Fatalf("a byte past the grant: %v", err)
	}
}

// outstanding is what a connection costs its receiver (docs/flow-control.md): what it granted and has not
// seen consumed. Once everything sent was consumed and granted again, it is the window.
func outstanding(w *Window) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.granted - w.consumed)
}

// fakeClock is a Window's clock, moved by the test.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestWindowGrowsOnlyForFastConsumers: a consumer that drains everything while the sender is nearly out of
// credit doubles the window, up to its largest; one that falls behind keeps its window.
func TestWindowGrowsOnlyForFastConsumers(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	fast := NewWindow(64<<10, 256<<10, nil)
	fast.now = clock.now
	for range 10 {
		clock.t = clock.t.Add(growEvery)
		credit := fast.granted - fast.received
		if err := fast.Receive(int(credit)); err != nil {
			t.Fatal(err)
		}
		fast.Consume(int(credit))
	}
	if s := outstanding(fast); s != 256<<10 {
		t.Fatalf("a fast consumer's window is %d, want the largest, 256 KiB", s)
	}
	slow := NewWindow(64<<10, 256<<10, nil)
	slow.now = clock.now
	for range 10 {
		clock.t = clock.t.Add(growEvery)
		credit := slow.granted - slow.received
		if err := slow.Receive(int(credit)); err != nil {
			t.Fatal(err)
		}
		slow.Consume(int(credit) / 2) // half of each window stays buffered
	}
	if s := outstanding(slow); s > 64<<10 {
		t.Fatalf("a slow consumer's connection holds %d bytes, more than its first window", s)
	}
}

// TestWindowGrowsWithTurnover: a window that is consumed whole within growEvery doubles at once, each time
// (TestWindowGrowsOnlyForFastConsumers: one consumed by halves does not).
func TestWindowGrowsWithTurnover(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	w := NewWindow(64<<10, 4<<20, nil)
	w.now = clock.now
	for range 10 { // ten windows drained within one instant
		credit := w.granted - w.received
		_ = w.Receive(int(credit))
		w.Consume(int(credit))
	}
	if s := outstanding(w); s != 4<<20 {
		t.Fatalf("a window consumed whole, again and again, grew to %d, want its largest", s)
	}
}

// TestWindowShrinksForSlowConsumers: a window that grew while its consumer kept up halves, at most every
// shrinkEvery and down to a quarter of where it started, while the consumer leaves more than half of it
// waiting; grants stop until the connection is within the smaller window.
func TestWindowShrinksForSlowConsumers(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	w := NewWindow(64<<10, 1<<20, nil)
	w.now = clock.now
	for outstanding(w) < 1<<20 { // a fast consumer grows it to its largest
		clock.t = clock.t.Add(growEvery)
		credit := w.granted - w.received
		_ = w.Receive(int(credit))
		w.Consume(int(credit))
	}
	_ = w.Receive(int(w.granted - w.received)) // a full window arrives, and the reader slows down
	for range 20 {
		clock.t = clock.t.Add(shrinkEvery)
		if g := w.Consume(1 << 10); g != 0 {
			t.Fatalf("granted %d bytes while the reader leaves most of the window waiting", g)
		}
	}
	if w.size != 16<<10 {
		t.Fatalf("the window of a slow reader is %d, want a quarter of the 64 KiB it started with", w.size)
	}
	// The next grant comes once the consumer is a quarter within the smaller window, and brings the
	// connection back to exactly that window.
	for outstanding(w) > 12<<10 {
		clock.t = clock.t.Add(growEvery) // a new turnover period each time: no growth for taking 1 KiB
		if g := w.Consume(1 << 10); g != 0 && outstanding(w) != 16<<10 {
			t.Fatalf("a grant of %d leaves %d outstanding, want the window back at 16 KiB", g, outstanding(w))
		} else if g != 0 {
			return
		}
	}
	t.Fatalf("no grant with %d bytes outstanding", outstanding(w))
}

// TestWindowShrinksBelowItsStartAndGrowsBack: a connection whose reader is slow from the start holds a
// quarter of its first window after a few shrinkEvery (not below MinWindow), and a reader that speeds up
// gets its window back, doubling each time it takes a whole one within growEvery.
func TestWindowShrinksBelowItsStartAndGrowsBack(t *testing.T) {
	for _, tc := range []struct {
		initial, least int64
	}{{64 << 10, 16 << 10}, {256 << 10, 64 << 10}, {32 << 10, MinWindow}, {8 << 10, 8 << 10}} {
		clock := &fakeClock{time.Unix(1000, 0)}
		w := NewWindow(int(tc.initial), 4<<20, nil)
		w.now = clock.now
		// The reader takes 1 KiB every 100 ms and leaves the rest waiting; grants top the sender up. In 40 s
		// it has taken even the largest first window.
		for range 400 {
			_ = w.Receive(int(w.granted - w.received))
			clock.t = clock.t.Add(100 * time.Millisecond)
			w.Consume(int(min(1<<10, w.received-w.consumed)))
		}
		if w.size != tc.least {
			t.Errorf("starting at %d: a slow reader's window is %d, want %d", tc.initial, w.size, tc.least)
		}
		if s := int64(outstanding(w)); s > tc.least {
			t.Errorf("starting at %d: a slow reader holds %d outstanding, want at most %d", tc.initial, s, tc.least)
		}
		// Now it takes whatever arrives at once.
		for range 20 {
			clock.t = clock.t.Add(growEvery)
			credit := w.granted - w.received
			_ = w.Receive(int(credit))
			w.Consume(int(w.received - w.consumed))
		}
		if w.size < tc.initial {
			t.Errorf("starting at %d: a fast reader's window is back at only %d", tc.initial, w.size)
		}
	}
}

// TestWindowShrinkPace: above where it started a window halves at most once a second (a reader on a long
// path sees its window halve and grow by turns); below, four times a second. Growing back to where it
// started takes nothing from the budget, however little the other connections left.
func TestWindowShrinkPace(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	lag := func(w *Window, after time.Duration, want int64) {
		t.Helper()
		clock.t = clock.t.Add(after)
		w.Consume(256)
		if w.size != want {
			t.Fatalf("%s later: window %d, want %d", after, w.size, want)
		}
	}
	w := NewWindow(64<<10, 1<<20, nil)
	w.now = clock.now
	for w.size < 256<<10 { // grown by a fast consumer
		clock.t = clock.t.Add(growEvery)
		_ = w.Receive(int(w.granted - w.received))
		w.Consume(int(w.received - w.consumed))
	}
	_ = w.Receive(int(w.granted - w.received))   // a full window arrives, and the reader lags
	lag(w, shrinkEvery, 128<<10)                 // a second after it last grew
	lag(w, shrinkBelowEvery, 128<<10)            // above its start: not yet
	lag(w, shrinkEvery-shrinkBelowEvery, 64<<10) // a second after that
	lag(w, shrinkBelowEvery/2, 64<<10)           // at its start: not before shrinkBelowEvery
	lag(w, shrinkBelowEvery/2, 32<<10)
	lag(w, shrinkBelowEvery, 16<<10)
	lag(w, shrinkBelowEvery, 16<<10) // its least

	// With the budget spent by other connections, a window that shrank below its start still gets back
	// there once its reader catches up.
	w = NewWindow(64<<10, 1<<20, NewBudget(0))
	w.now = clock.now
	_ = w.Receive(64 << 10)
	lag(w, 0, 32<<10)
	lag(w, shrinkBelowEvery, 16<<10)
	for range 10 {
		clock.t = clock.t.Add(growEvery)
		w.Consume(int(w.received - w.consumed))
		_ = w.Receive(int(w.granted - w.received))
	}
	if w.size != 64<<10 {
		t.Fatalf("with no budget left, a reader that caught up has a window of %d, want the 64 KiB it started with", w.size)
	}
}

func TestCredit(t *testing.T) {
	c := NewCredit(100, 1000)
	ctx := context.Background()
	if n, waited, err := c.Wait(ctx); n != 100 || waited != 0 || err != nil {
		t.Fatalf("Wait: %d, %s, %v", n, waited, err)
	}
	c.Use(100)
	got := make(chan int)
	blocked := make(chan time.Duration, 1)
	go func() {
		n, waited, _ := c.Wait(ctx)
		blocked <- waited
		got <- n
	}()
	select {
	case n := <-got:
		t.Fatalf("Wait returned %d without credit", n)
	case <-time.After(50 * time.Millisecond):
	}
	if err := c.Add(500); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != 500 {
		t.Fatalf("after a grant of 500: %d", n)
	}
	if waited := <-blocked; waited < 50*time.Millisecond {
		t.Fatalf("Wait blocked for at least 50ms and reported %s", waited)
	}
	if err := c.Add(501); !errors.Is(err, ErrCreditOverflow) {
		t.Fatalf("credit past the largest window: %v", err)
	}
	if err := c.Add(0); !errors.Is(err, ErrCreditOverflow) {
		t.Fatalf("a grant of nothing: %v", err)
	}
	if n, _, err := c.Wait(ctx); n != 500 || err != nil {
		t.Fatalf("a refused grant changed the credit: %d, %v", n, err)
	}
	c.Use(500)
	go func() {
		_, _, err := c.Wait(ctx)
		got <- map[bool]int{true: 1}[errors.Is(err, ErrClosed)]
	}()
	c.Close(ErrClosed)
	if v := <-got; v != 1 {
		t.Fatal("Close did not wake the waiting sender with its error")
	}
}

func TestParseOffer(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    Offer
		ok, err bool
	}{
		{nil, Offer{}, false, false},
		{[]string{"v2;window=65536;max=65536"}, Offer{}, false, false},
		{[]string{"v1;window=65536;max=4194304"}, Offer{65536, 4194304}, true, false},
		{[]string{"v1;window=65536;max=4194304;future=1"}, Offer{65536, 4194304}, true, false},
		// Unknown fields are skipped whatever their value, and so are flags without a value: only the known
		// fields must be numbers.
		{[]string{"v1;window=65536;max=4194304;codec=zstd"}, Offer{65536, 4194304}, true, false},
		{[]string{"v1;window=65536;zerocopy;max=4194304"}, Offer{65536, 4194304}, true, false},
		{[]string{"v1;window=65536;max=4194304;"}, Offer{65536, 4194304}, true, false},
		{[]string{"v1;window;max=4194304"}, Offer{}, false, true},
		{[]string{"v1;window=65536;max=4M"}, Offer{}, false, true},
		{[]string{"v1;window=1;max=2"}, Offer{}, false, true},
		{[]string{"v1;window=65536;max=1024"}, Offer{}, false, true},
		{[]string{"v1;window=65536;max=1099511627776"}, Offer{}, false, true},
		{[]string{"v1;window=x;max=1"}, Offer{}, false, true},
		{[]string{"v1"}, Offer{}, false, true},
		// Several offers, in the peer's order of preference: the first v1 one is taken, the others skipped.
		{[]string{"v2;window=65536;max=65536", "v1;window=65536;max=4194304"}, Offer{65536, 4194304}, true, false},
		{[]string{"v2;codec=zstd", "v1;window=32768;max=65536", "v1;window=65536;max=4194304"}, Offer{32768, 65536}, true, false},
		{[]string{"v3;window=1", "v2;window=65536;max=65536"}, Offer{}, false, false},
		{[]string{"v2;window=65536;max=65536", "v1;window=1;max=2"}, Offer{}, false, true},
		// The values of a key joined with commas, as gRPC lets a proxy do.
		{[]string{"v2;window=65536;max=65536, v1;window=65536;max=4194304"}, Offer{65536, 4194304}, true, false},
		{[]string{"v2;x=1,v1;window=65536;max=4194304,"}, Offer{65536, 4194304}, true, false},
	} {
		got, ok, err := ParseOffer(tc.in)
		if got != tc.want || ok != tc.ok || (err != nil) != tc.err {
			t.Errorf("ParseOffer(%q) = %+v, %v, %v", tc.in, got, ok, err)
		}
	}
	o := Offer{Window: 65536, Max: 1 << 20}
	if got, ok, err := ParseOffer([]string{o.String()}); got != o || !ok || err != nil {
		t.Errorf("round trip of %v: %+v %v %v", o, got, ok, err)
	}
}

func TestParseAnswer(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    Offer
		ok, err bool
	}{
		{nil, Offer{}, false, false},
		{[]string{"v1;window=65536;max=4194304"}, Offer{65536, 4194304}, true, false},
		{[]string{"v1;window=65536;max=4194304;codec=zstd"}, Offer{65536, 4194304}, true, false},
		// A version the agent did not offer: the server would use it, and the agent could not.
		{[]string{"v2;window=65536;max=4194304"}, Offer{}, false, true},
		// An answer names one version.
		{[]string{"v1;window=65536;max=4194304", "v1;window=65536;max=4194304"}, Offer{}, false, true},
		{[]string{"v2;window=65536;max=4194304,v1;window=65536;max=4194304"}, Offer{}, false, true},
		{[]string{"v1;window=65536;max=1024"}, Offer{}, false, true},
	} {
		got, ok, err := ParseAnswer(tc.in)
		if got != tc.want || ok != tc.ok || (err != nil) != tc.err {
			t.Errorf("ParseAnswer(%q) = %+v, %v, %v", tc.in, got, ok, err)
		}
	}
}

func TestGrantPackets(t *testing.T) {
	in := map[int64]int64{1: 100, 1 << 40: MaxWindow, 7: 1}
	pkt := EncodeGrants(in)
	if pkt.Type != GrantType {
		t.Fatalf("type %v", pkt.Type)
	}
	out := map[int64]int64{}
	if err := DecodeGrants(pkt, func(id, n int64) error { out[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("decoded %v", out)
	}
	for id, n := range in {
		if out[id] != n {
			t.Fatalf("decoded %v, want %v", out, in)
		}
	}
	for name, bad := range map[string]*client.Packet{
		"truncated":       {Type: GrantType, Payload: &client.Packet_Data{Data: &client.Data{Data: []byte{0x80}}}},
		"no increment":    {Type: GrantType, Payload: &client.Packet_Data{Data: &client.Data{Data: []byte{0x01}}}},
		"over MaxWindow":  EncodeGrants(map[int64]int64{1: MaxWindow + 1}),
		"a connection ID": {Type: GrantType, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 3}}},
		"no payload":      {Type: GrantType},
	} {
		if err := DecodeGrants(bad, func(int64, int64) error { return nil }); !errors.Is(err, ErrBadGrant) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestGrantsCoalesce: grants owed while one is being sent go out together, in one packet.
func TestGrantsCoalesce(t *testing.T) {
	sent := make(chan *client.Packet, 10)
	release := make(chan struct{})
	g := NewGrants(func(p *client.Packet) error {
		sent <- p
		<-release
		return nil
	})
	g.Add(1, 10) // goes out at once, and its send blocks
	first := <-sent
	g.Add(1, 5)
	g.Add(2, 7)
	g.Add(1, 5)
	g.Add(3, 0) // nothing owed: nothing sent
	close(release)
	second := <-sent
	got := map[int64]int64{}
	_ = DecodeGrants(first, func(id, n int64) error { got[id] += n; return nil })
	if got[1] != 10 {
		t.Fatalf("first packet: %v", got)
	}
	got = map[int64]int64{}
	_ = DecodeGrants(second, func(id, n int64) error { got[id] += n; return nil })
	if len(got) != 2 || got[1] != 10 || got[2] != 7 {
		t.Fatalf("second packet: %v", got)
	}
	select {
	case p := <-sent:
		t.Fatalf("a third packet: %v", p)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestBudgetBoundsGrowthTogether: the windows of one stream grow only as far as their budget allows, and a
// released window gives its growth back.
func TestBudgetBoundsGrowthTogether(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	budget := NewBudget(1 << 20)
	var windows []*Window
	for range 4 {
		w := NewWindow(64<<10, 4<<20, budget)
		w.now = clock.now
		windows = append(windows, w)
	}
	for range 20 {
		clock.t = clock.t.Add(growEvery)
		for _, w := range windows {
			credit := w.granted - w.received
			_ = w.Receive(int(credit))
			w.Consume(int(credit))
		}
	}
	grown := 0
	for _, w := range windows {
		grown += outstanding(w) - 64<<10
	}
	if grown > 1<<20 || budget.Left() != 1<<20-grown {
		t.Fatalf("the windows grew by %d bytes in all with a budget of 1 MiB, %d left", grown, budget.Left())
	}
	if grown < 1<<19 {
		t.Fatalf("the windows grew by only %d bytes of a 1 MiB budget", grown)
	}
	for _, w := range windows {
		w.Release()
		w.Release()
	}
	if budget.Left() != 1<<20 {
		t.Fatalf("after every window was released, %d of 1 MiB is left", budget.Left())
	}
}

// TestWindowConsumeAfterReleaseTakesNothing: a connection's writer may still be in a write when the
// connection ends and releases its window; the Consume that follows must not take budget that nothing will
// ever give back, or the stream's other connections could never grow again.
func TestWindowConsumeAfterReleaseTakesNothing(t *testing.T) {
	clock := &fakeClock{time.Unix(1000, 0)}
	b := NewBudget(4 << 20)
	w := NewWindow(64<<10, 4<<20, b)
	w.now = clock.now
	for range 8 {
		clock.t = clock.t.Add(growEvery)
		credit := w.granted - w.received
		if err := w.Receive(int(credit)); err != nil {
			t.Fatal(err)
		}
		w.Consume(int(credit))
	}
	credit := w.granted - w.received
	if err := w.Receive(int(credit)); err != nil {
		t.Fatal(err)
	}
	w.Release()
	if g := w.Consume(int(credit)); g != 0 { // the writer's last write returns
		t.Errorf("a released window granted %d bytes", g)
	}
	if b.Left() != 4<<20 {
		t.Errorf("a Consume after Release took %d bytes of budget for good", 4<<20-b.Left())
	}
}
