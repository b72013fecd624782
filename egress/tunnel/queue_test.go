package tunnel

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

func dataPacket(id int64, b []byte) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: b}}}
}

func TestSendQueueOrderMergeAndAccounting(t *testing.T) {
	q := newSendQueue(1<<20, time.Second, packetSize, nil)
	q.merge = mergeData
	var want bytes.Buffer
	for i := range 200 {
		b := bytes.Repeat([]byte{byte(i)}, 4096)
		want.Write(b)
		if err := q.push(dataPacket(7, b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.push(&client.Packet{Type: client.PacketType_CLOSE_RSP}); err != nil {
		t.Fatal(err)
	}
	q.close()
	var got bytes.Buffer
	msgs, closes := 0, 0
	if err := q.run(nil, func(p *client.Packet) error {
		if d := p.GetData(); d != nil {
			msgs++
			got.Write(d.Data)
		} else if closes++; got.Len() != want.Len() {
			t.Error("CLOSE_RSP overtook data")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) || closes != 1 {
		t.Fatalf("data mangled (%d of %d bytes) or close lost (%d)", got.Len(), want.Len(), closes)
	}
	if msgs >= 200 {
		t.Errorf("queued packets were not merged: %d messages", msgs)
	}
	if q.bytes != 0 {
		t.Errorf("accounting left %d bytes", q.bytes)
	}
	if err := q.push(dataPacket(7, nil)); !errors.Is(err, errQueueClosed) {
		t.Errorf("push after close: %v", err)
	}
}

func TestSendQueueFullWaitsThenStalls(t *testing.T) {
	stalled := make(chan struct{})
	q := newSendQueue(64<<10, 200*time.Millisecond, packetSize, func() { close(stalled) })
	big := make([]byte, 60<<10)
	if err := q.push(dataPacket(1, big)); err != nil { // fits
		t.Fatal(err)
	}
	// The writer is stuck on the first packet, which still counts until it is sent.
	release := make(chan struct{})
	go q.run(nil, func(*client.Packet) error { <-release; return nil })
	began := time.Now()
	err := q.push(dataPacket(1, big)) // full: waits, then gives up
	if !errors.Is(err, errStalled) || time.Since(began) < 150*time.Millisecond {
		t.Fatalf("push into a full queue: %v after %v", err, time.Since(began))
	}
	select {
	case <-stalled:
	default:
		t.Error("onStall not called")
	}
	close(release)
}
