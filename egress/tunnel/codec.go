package tunnel

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// zeroCopyMin is the payload size from which DATA packets skip a copy. Below it the copy is cheaper than
// the extra buffer bookkeeping.
const zeroCopyMin = 16 << 10

// packetCodec is the protobuf codec for the tunnel's gRPC servers, with a fast path for DATA packets, which
// carry every byte of every tunnel. It is wire-identical to the standard codec: other messages, and any DATA
// packet it does not recognise byte for byte, go through proto.
//
//   - Unmarshal: the payload aliases gRPC's receive buffer instead of being copied out of it. The buffer is
//     kept (one reference is never released), so gRPC does not recycle it while the packet is in use; the
//     garbage collector frees it with the packet.
//   - Marshal (only with zeroCopySend): the payload is handed to gRPC as it is, behind a few header bytes,
//     instead of being copied into a new message buffer. That is only safe when nobody writes into a
//     payload after sending it, which holds for packets that were themselves received from a peer, but not
//     for upstream's HTTP CONNECT handler, which reuses its read buffer.
type packetCodec struct {
	zeroCopySend bool
}

var _ encoding.CodecV2 = packetCodec{}

func (packetCodec) Name() string { return "proto" }

func (c packetCodec) Marshal(v any) (mem.BufferSlice, error) {
	p, ok := v.(*client.Packet)
	if ok && c.zeroCopySend && p.Type == client.PacketType_DATA {
		if d := p.GetData(); d != nil && len(d.Data) >= zeroCopyMin && len(p.ProtoReflect().GetUnknown()) == 0 {
			return mem.BufferSlice{mem.SliceBuffer(dataHeader(d)), mem.SliceBuffer(d.Data)}, nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("tunnel codec: cannot marshal %T", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// dataHeader encodes a DATA Packet up to, and without, its payload bytes (fields in proto's order).
func dataHeader(d *client.Data) []byte {
	inner := 0
	if d.ConnectID != 0 {
		inner += 1 + protowire.SizeVarint(uint64(d.ConnectID))
	}
	if d.Error != "" {
		inner += 1 + protowire.SizeBytes(len(d.Error))
	}
	inner += 1 + protowire.SizeBytes(len(d.Data))
	b := make([]byte, 0, 16+len(d.Error))
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(client.PacketType_DATA))
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	if d.ConnectID != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d.ConnectID))
	}
	if d.Error != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, d.Error)
	}
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(len(d.Data)))
}

func (packetCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*client.Packet)
	if ok && data.Len() >= zeroCopyMin {
		var b []byte
		if len(data) == 1 {
			data[0].Ref() // never released: the payload below aliases this buffer
			b = data[0].ReadOnlyData()
		} else {
			b = data.Materialize()
		}
		if d, ok := parseData(b); ok {
			proto.Reset(p)
			p.Type = client.PacketType_DATA
			p.Payload = &client.Packet_Data{Data: d}
			return nil
		}
		return proto.Unmarshal(b, p)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("tunnel codec: cannot unmarshal into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// parseData decodes b if it is exactly a DATA Packet made of known fields, each at most once, with the
// payload aliasing b. Anything else reports false and is left to proto.
func parseData(b []byte) (*client.Data, bool) {
	var typ uint64
	var inner []byte
	seen := 0
	for len(b) > 0 {
		num, wt, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case num == 1 && wt == protowire.VarintType && seen&1 == 0:
			typ, n = protowire.ConsumeVarint(b)
			seen |= 1
		case num == 4 && wt == protowire.BytesType && seen&2 == 0:
			inner, n = protowire.ConsumeBytes(b)
			seen |= 2
		default:
			return nil, false
		}
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	if typ != uint64(client.PacketType_DATA) || seen&2 == 0 {
		return nil, false
	}
	d := &client.Data{}
	seen = 0
	for len(inner) > 0 {
		num, wt, n := protowire.ConsumeTag(inner)
		if n < 0 {
			return nil, false
		}
		inner = inner[n:]
		switch {
		case num == 1 && wt == protowire.VarintType && seen&1 == 0:
			var v uint64
			v, n = protowire.ConsumeVarint(inner)
			d.ConnectID = int64(v)
			seen |= 1
		case num == 2 && wt == protowire.BytesType && seen&2 == 0:
			var v []byte
			v, n = protowire.ConsumeBytes(inner)
			if !utf8.Valid(v) {
				return nil, false // proto3 strings must be UTF-8; let proto report it
			}
			d.Error = string(v)
			seen |= 2
		case num == 3 && wt == protowire.BytesType && seen&4 == 0:
			d.Data, n = protowire.ConsumeBytes(inner)
			seen |= 4
		default:
			return nil, false
		}
		if n < 0 {
			return nil, false
		}
		inner = inner[n:]
	}
	return d, true
}
