package wire

import (
	"bytes"
	"fmt"
	"math"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

func dataPacket(id int64, b []byte) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: b}}}
}

// unknownInData gives p's DATA a field that client.Data does not know (99, varint 1).
func unknownInData(p *client.Packet) *client.Packet {
	p.GetData().ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	return p
}

// TestCodecWireIdentical: with every fast path on or off, the codec encodes as proto does and decodes
// what proto encodes.
func TestCodecWireIdentical(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB
	packets := []*client.Packet{
		dataPacket(42, big),
		dataPacket(0, big),
		{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 9, Error: "boom", Data: big}}},
		dataPacket(42, []byte("small")),
		unknownInData(dataPacket(5, big)),
		{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "tcp", Address: "10.0.0.1:443", Random: 7}}},
		{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{CloseResponse: &client.CloseResponse{ConnectID: 3}}},
	}
	for _, c := range []Codec{{}, {AliasReceived: true}, {ZeroCopySend: true}, {AliasReceived: true, ZeroCopySend: true}} {
		zc := c
		for i, p := range packets {
			got, err := c.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
			if !bytes.Equal(got.Materialize(), want) {
				t.Errorf("%+v packet %d: encoding differs from proto's", zc, i)
			}
			// Decode proto's bytes, in one buffer and split in two.
			for _, in := range []mem.BufferSlice{
				{mem.SliceBuffer(bytes.Clone(want))},
				{mem.SliceBuffer(bytes.Clone(want[:len(want)/2])), mem.SliceBuffer(bytes.Clone(want[len(want)/2:]))},
			} {
				var dec client.Packet
				if err := c.Unmarshal(in, &dec); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(&dec, p) {
					t.Errorf("packet %d: decoded %v", i, &dec)
				}
			}
		}
	}
	// Not exactly a DATA packet (a field repeated): proto's merge semantics decide, not the fast path.
	b, _ := proto.Marshal(dataPacket(1, big))
	twice := append(bytes.Clone(b), b...)
	var viaCodec, viaProto client.Packet
	if err := (Codec{AliasReceived: true}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(twice)}, &viaCodec); err != nil {
		t.Fatal(err)
	}
	proto.Unmarshal(twice, &viaProto)
	if !proto.Equal(&viaCodec, &viaProto) {
		t.Error("repeated fields decoded differently from proto")
	}
}

// countingPool counts the Puts of each buffer, on top of Pool.
type countingPool struct {
	mem.BufferPool
	mu   sync.Mutex
	puts map[*[]byte]int
}

func (p *countingPool) Put(bp *[]byte) {
	p.mu.Lock()
	p.puts[bp]++
	p.mu.Unlock()
	p.BufferPool.Put(bp)
}

// get takes a buffer from the pool and forgets its earlier Puts: the pool hands the same ones out again.
func (p *countingPool) get(n int) *[]byte {
	bp := p.Get(n)
	p.mu.Lock()
	delete(p.puts, bp)
	p.mu.Unlock()
	return bp
}

func (p *countingPool) count(bp *[]byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.puts[bp]
}

// TestCodecOwnedData: a DATA packet sent with its buffer encodes as proto does, and the buffer goes back to
// Pool exactly once: when gRPC frees the marshalled slice, or, for a packet the fast path leaves to proto,
// once Marshal has copied it.
func TestCodecOwnedData(t *testing.T) {
	counting := &countingPool{BufferPool: Pool, puts: map[*[]byte]int{}}
	Pool = counting
	t.Cleanup(func() { Pool = counting.BufferPool })

	for _, size := range []int{ZeroCopyMin - 1, ZeroCopyMin, ZeroCopyMin + 1, 1<<20 - 128, 1 << 20} {
		for _, id := range []int64{0, 7, math.MaxInt64} {
			for _, errMsg := range []string{"", "connection reset by peer"} {
				for _, unknown := range []bool{false, true} {
					name := fmt.Sprintf("size=%d/id=%d/error=%q/unknown=%v", size, id, errMsg, unknown)
					bp := counting.get(size)
					for i := range *bp {
						(*bp)[i] = byte(i*7 + int(id))
					}
					p := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Error: errMsg, Data: *bp}}}
					if unknown {
						unknownInData(p)
					}
					want, err := proto.Marshal(p)
					if err != nil {
						t.Fatal(err)
					}
					got, err := Codec{}.Marshal(&OwnedData{Packet: p, Buf: bp})
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					zeroCopy := size >= ZeroCopyMin && !unknown
					if !bytes.Equal(got.Materialize(), want) {
						t.Errorf("%s: encoding differs from proto's", name)
					}
					if n, want := counting.count(bp), map[bool]int{true: 0, false: 1}[zeroCopy]; n != want {
						t.Errorf("%s: buffer put back %d times before the slice was freed, want %d", name, n, want)
					}
					if zeroCopy && (len(got) != 2 || &got[1].ReadOnlyData()[0] != &(*bp)[0]) {
						t.Errorf("%s: the payload was copied", name)
					}
					got.Free()
					if n := counting.count(bp); n != 1 {
						t.Errorf("%s: buffer put back %d times after the slice was freed, want 1", name, n)
					}
				}
			}
		}
	}
	// A payload that is not the buffer's (or no buffer) is copied; the buffer still goes back, once.
	bp := counting.get(64 << 10)
	other := bytes.Repeat([]byte{1}, 64<<10)
	p := dataPacket(3, other)
	want, _ := proto.Marshal(p)
	got, err := Codec{}.Marshal(&OwnedData{Packet: p, Buf: bp})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), want) {
		t.Error("foreign payload: encoding differs from proto's")
	}
	got.Free()
	if n := counting.count(bp); n != 1 {
		t.Errorf("foreign payload: buffer put back %d times, want 1", n)
	}
	if got, err := (Codec{}).Marshal(&OwnedData{Packet: p}); err != nil || !bytes.Equal(got.Materialize(), want) {
		t.Errorf("no buffer: %v", err)
	}
}
