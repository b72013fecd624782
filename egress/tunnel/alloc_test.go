package tunnel

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"runtime"
	"testing"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// ctxStream is a frontend stream with only a context.
type ctxStream struct{ grpc.ServerStream }

func (ctxStream) Context() context.Context { return context.Background() }

// TestTakeLeavesFittingPacketAlone: DATA within its connection's credit goes on to upstream as it was
// received, without being rebuilt.
func TestTakeLeavesFittingPacketAlone(t *testing.T) {
	f := &frontendFlow{conns: map[int64]*connFlow{3: {id: 3, credit: flow.NewCredit(flow.MaxWindow, flow.MaxWindow)}}}
	s := &dialStream{ServerStream: ctxStream{}, flow: f}
	pkt := dataPacket(3, make([]byte, 100))
	d := pkt.GetData()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := s.take(pkt, pkt.GetData()); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || pkt.GetData() != d || s.rest != nil {
		t.Errorf("a packet within its credit cost %v allocations, or was rebuilt", allocs)
	}
}

// smallReads returns a few bytes per read, as an interactive CONNECT client writes.
type smallReads struct{}

func (smallReads) Read(p []byte) (int, error) { return copy(p, "0123456789"), nil }

// TestConnectSmallReadsCostTheirBytes: a CONNECT tunnel's read of a few bytes allocates about those bytes,
// not a whole read buffer.
func TestConnectSmallReadsCostTheirBytes(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	req, err := http.NewRequest(http.MethodConnect, "http://198.18.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newConnectStream(a, bufio.NewReaderSize(smallReads{}, 16), req)
	defer c.close()
	c.dialSent, c.connID = true, 1
	c.once.Do(func() { close(c.answered) })
	var pkt client.Packet
	read := func() {
		if err := c.RecvMsg(&pkt); err != nil || len(pkt.GetData().GetData()) != 10 {
			t.Fatalf("RecvMsg: %v, %d bytes", err, len(pkt.GetData().GetData()))
		}
	}
	read()
	const reads = 1000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		read()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / reads; per > 4<<10 {
		t.Errorf("a 10-byte read allocated %d bytes", per)
	}
}
