package tunnel

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

func dataPacket(id int64, b []byte) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: b}}}
}

// frontendMessages pushes packets into a frontend queue whose reader takes nothing until they are all
// queued, and returns the messages its writer sends, and the most bytes the queue counted.
func frontendMessages(t *testing.T, packets []*client.Packet, unbound bool) ([]*client.Packet, int) {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{metrics: m, cfg: Config{ConnectionBuffer: flow.DefaultLimit, StallTimeout: time.Minute}}
	q := newFrontendQueue(s, nil, func() { t.Error("stalled") })
	if unbound {
		q.Unbound()
	}
	for _, p := range packets {
		if err := q.Push(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	most := q.Len()
	q.Close()
	var msgs []*client.Packet
	ended := make(chan error, 1)
	q.Start(func(batch []*client.Packet) error {
		return s.sendPackets(func(m any) error { msgs = append(msgs, m.(*client.Packet)); return nil }, batch,
			func() int { return frontendChunk })
	}, func(err error) { ended <- err })
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	return msgs, most
}

// TestFrontendMergesInOrder: small DATA packets go out as fewer, larger messages, in order, and a
// CLOSE_RSP queued after them does not overtake them.
func TestFrontendMergesInOrder(t *testing.T) {
	var packets []*client.Packet
	var want bytes.Buffer
	for i := range 200 {
		b := bytes.Repeat([]byte{byte(i)}, 4096)
		want.Write(b)
		packets = append(packets, dataPacket(7, b))
	}
	packets = append(packets, &client.Packet{Type: client.PacketType_CLOSE_RSP})
	msgs, _ := frontendMessages(t, packets, false)
	var got bytes.Buffer
	data, closes := 0, 0
	for _, p := range msgs {
		if d := p.GetData(); d != nil {
			data++
			if len(d.Data) > frontendChunk {
				t.Errorf("a message of %d bytes, more than frontendChunk", len(d.Data))
			}
			got.Write(d.Data)
		} else if closes++; got.Len() != want.Len() {
			t.Error("CLOSE_RSP overtook data")
		}
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) || closes != 1 {
		t.Fatalf("data mangled (%d of %d bytes) or close lost (%d)", got.Len(), want.Len(), closes)
	}
	if want := (want.Len() + frontendChunk - 1) / frontendChunk; data != want {
		t.Errorf("200 packets of 4 KiB went out as %d messages, want %d of up to frontendChunk", data, want)
	}
}

// TestLargePacketsGoAsTheyAre: a DATA packet of flow.MergeBelow or more is sent as it is, without a copy,
// and small packets around it are merged only among themselves.
func TestLargePacketsGoAsTheyAre(t *testing.T) {
	big := bytes.Repeat([]byte{'b'}, flow.MergeBelow)
	msgs, _ := frontendMessages(t, []*client.Packet{dataPacket(7, []byte("a")), dataPacket(7, []byte("a")),
		dataPacket(7, big), dataPacket(7, []byte("c"))}, false)
	var sizes []int
	var bigSent []byte
	for _, p := range msgs {
		d := p.GetData()
		sizes = append(sizes, len(d.Data))
		if len(d.Data) == len(big) {
			bigSent = d.Data
		}
	}
	if !slices.Equal(sizes, []int{2, flow.MergeBelow, 1}) {
		t.Fatalf("messages of %v bytes, want [2 %d 1]", sizes, flow.MergeBelow)
	}
	if &bigSent[0] != &big[0] {
		t.Fatal("the large packet was copied")
	}
}

// TestTinyPacketsCostTheirBytes: a window of 1-byte packets queued for a reader that takes nothing is held as
// a few merged packets, so that the queue's count (and the heap) stays near the window, not a hundred
// times it.
func TestTinyPacketsCostTheirBytes(t *testing.T) {
	const window = 1 << 20
	packets := make([]*client.Packet, window)
	for i := range packets {
		packets[i] = dataPacket(7, []byte{byte(i)})
	}
	msgs, most := frontendMessages(t, packets, true)
	if most > window+window/100 {
		t.Errorf("a window of %d 1-byte packets counted %d bytes in the queue", window, most)
	}
	n := 0
	for i, p := range msgs {
		d := p.GetData().Data
		for j, b := range d {
			if b != byte(n+j) {
				t.Fatalf("message %d: byte %d mangled", i, j)
			}
		}
		n += len(d)
	}
	if n != window || len(msgs) > window/frontendChunk+1 {
		t.Errorf("%d bytes as %d messages", n, len(msgs))
	}
}

// TestFirstMessagesAreSmall: kube-apiserver's client holds up to ten messages of a tunnel before its reader
// takes any, so a tunnel's first firstBytes reach it in messages of at most firstChunk, and only a longer
// transfer gets frontendChunk's. A raw gRPC frontend records every DATA message of an 8 MiB download.
func TestFirstMessagesAreSmall(t *testing.T) {
	e := newEnv(t)
	s := start(t, e.config("grpc"))
	startKonnectAgent(t, e, "agent-1", s.agentPort())
	s.waitAgents(t, 1)
	web := startHTTPBackend(t)
	stream := rawFrontend(t, s.cfg.UDSName)
	if err := stream.Send(dialReq(1, web)); err != nil {
		t.Fatal(err)
	}
	rsp, err := stream.Recv()
	if err != nil || rsp.GetDialResponse().GetConnectID() == 0 {
		t.Fatalf("dial: %v %v", rsp, err)
	}
	id := rsp.GetDialResponse().GetConnectID()
	const size = 8 << 20
	get := fmt.Sprintf("GET /bytes?n=%d HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", size, web)
	if err := stream.Send(dataPacket(id, []byte(get))); err != nil {
		t.Fatal(err)
	}
	var got, largestFirst, largestLater int
	for got < size {
		pkt, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		n := len(pkt.GetData().GetData())
		if got < firstBytes {
			largestFirst = max(largestFirst, n)
		} else {
			largestLater = max(largestLater, n)
		}
		got += n
	}
	if largestFirst > firstChunk {
		t.Errorf("a message of %d bytes within the tunnel's first %d, want at most %d", largestFirst, firstBytes, firstChunk)
	}
	if largestLater <= firstChunk {
		t.Errorf("after the first %d bytes the largest message was %d bytes, want larger than %d", firstBytes, largestLater, firstChunk)
	}
}

// TestSentLedger: a message counts as carried once the bytes written reach its end, counted at its fewest
// bytes on the wire, in the order sent; bytes written before the send are counted; and only one stream at a
// time holds a connection's ledger.
func TestSentLedger(t *testing.T) {
	var l sentLedger
	var carried []int
	note := func(id int64, _ int) { carried = append(carried, int(id)) }
	if !l.claim(note) || l.claim(note) {
		t.Fatal("a ledger is claimed once at a time")
	}
	l.sent(1, 100)
	l.sent(2, 200)
	l.wrote(100 + minWireOverhead - 1)
	if len(carried) != 0 {
		t.Fatalf("carried %v before the first message's bytes were all written", carried)
	}
	l.wrote(1)
	if len(carried) != 1 || carried[0] != 1 {
		t.Fatalf("carried %v, want [1]", carried)
	}
	l.wrote(200 + minWireOverhead + 50) // the second message, and the third's payload without its framing
	l.sent(3, 50)                       // which gRPC wrote before its send returned
	if len(carried) != 2 || carried[1] != 2 {
		t.Fatalf("carried %v, want [1 2]", carried)
	}
	l.wrote(minWireOverhead)
	if len(carried) != 3 || carried[2] != 3 {
		t.Fatalf("carried %v, want [1 2 3]", carried)
	}
	l.sent(4, 10)
	l.release()
	l.wrote(1 << 20)
	if len(carried) != 3 {
		t.Fatalf("a released ledger carried %v", carried)
	}
	if !l.claim(note) {
		t.Fatal("a released ledger can be claimed again")
	}
}

// TestFrontendConnKeepsReadinessReads: kube-apiserver's connections reach gRPC wrapped (sentConn), and the
// wrapper keeps gRPC's readiness reads (ReadOnReady), which take a read buffer only once data has arrived:
// without them every idle tunnel pinned a 32 KiB buffer of its own (row 3 of make bench, 1,000 idle
// tunnels, rose by a third). It reads what arrived, reports the end as io.EOF, and counts what it writes.
func TestFrontendConnKeepsReadinessReads(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	raw, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn, info, err := tunnelCreds{insecure.NewCredentials()}.ServerHandshake(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rr, ok := conn.(interface {
		ReadOnReady(int, mem.BufferPool) (*[]byte, int, error)
	})
	if !ok {
		t.Fatalf("the frontend connection (%T) lost gRPC's readiness reads", conn)
	}
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf, n, err := rr.ReadOnReady(32<<10, mem.DefaultBufferPool())
	if err != nil {
		t.Fatalf("ReadOnReady: %v", err)
	}
	if string((*buf)[:n]) != "hello" {
		t.Fatalf("ReadOnReady read %q, want %q", (*buf)[:n], "hello")
	}
	if _, err := conn.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if w := info.(tunnelInfo).sent.ledger.written; w != 5 {
		t.Fatalf("the ledger counted %d bytes written, want 5", w)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(client, got); err != nil || string(got) != "world" {
		t.Fatalf("the client read %q, %v", got, err)
	}
	client.Close()
	if _, _, err := rr.ReadOnReady(32<<10, mem.DefaultBufferPool()); err != io.EOF {
		t.Fatalf("ReadOnReady after the peer closed: %v, want io.EOF", err)
	}
}
