package tunnel

import (
	"bytes"
	"testing"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

func dataPacket(id int64, b []byte) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: b}}}
}

// TestSendPacketsMergesInOrder: a batch of small DATA packets goes out as fewer, larger messages, in order,
// and a CLOSE_RSP queued after them does not overtake them.
func TestSendPacketsMergesInOrder(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{metrics: m}
	var batch []*client.Packet
	var want bytes.Buffer
	for i := range 200 {
		b := bytes.Repeat([]byte{byte(i)}, 4096)
		want.Write(b)
		batch = append(batch, dataPacket(7, b))
	}
	batch = append(batch, &client.Packet{Type: client.PacketType_CLOSE_RSP})
	var got bytes.Buffer
	msgs, closes := 0, 0
	err = s.sendPackets(func(m any) error {
		p := m.(*client.Packet)
		if d := p.GetData(); d != nil {
			msgs++
			if len(d.Data) > frontendChunk {
				t.Errorf("a message of %d bytes, more than frontendChunk", len(d.Data))
			}
			got.Write(d.Data)
		} else if closes++; got.Len() != want.Len() {
			t.Error("CLOSE_RSP overtook data")
		}
		return nil
	}, batch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) || closes != 1 {
		t.Fatalf("data mangled (%d of %d bytes) or close lost (%d)", got.Len(), want.Len(), closes)
	}
	if want := (want.Len() + frontendChunk - 1) / frontendChunk; msgs != want {
		t.Errorf("200 packets of 4 KiB went out as %d messages, want %d of up to frontendChunk", msgs, want)
	}
}
