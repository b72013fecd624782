package wire

import (
	"bytes"
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
