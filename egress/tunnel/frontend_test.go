package tunnel

import (
	"bytes"
	"slices"
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

// TestLargePacketsGoAsTheyAre: a DATA packet of mergeBelow or more is sent as it is, without a copy, and
// small packets around it are merged only among themselves.
func TestLargePacketsGoAsTheyAre(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{metrics: m}
	big := bytes.Repeat([]byte{'b'}, mergeBelow)
	batch := []*client.Packet{dataPacket(7, []byte("a")), dataPacket(7, []byte("a")), dataPacket(7, big), dataPacket(7, []byte("c"))}
	var sizes []int
	var bigSent []byte
	err = s.sendPackets(func(m any) error {
		d := m.(*client.Packet).GetData()
		sizes = append(sizes, len(d.Data))
		if len(d.Data) == len(big) {
			bigSent = d.Data
		}
		return nil
	}, batch)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sizes, []int{2, mergeBelow, 1}) {
		t.Fatalf("messages of %v bytes, want [2 %d 1]", sizes, mergeBelow)
	}
	if &bigSent[0] != &big[0] {
		t.Fatal("the large packet was copied")
	}
}
