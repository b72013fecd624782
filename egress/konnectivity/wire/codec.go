// Package wire is the one gRPC codec of konnect's Konnectivity links, used by the server (egress/tunnel)
// and the agent: protobuf, wire-identical to gRPC's standard codec and registered under the same name, with
// the buffer handling that DATA packets, which carry every byte of every tunnel, need to be cheap.
package wire

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// ZeroCopyMin is the payload size from which DATA packets skip a copy. Below it the copy is cheaper than
// the extra buffer bookkeeping.
const ZeroCopyMin = 16 << 10

// Codec is gRPC's protobuf encoding with buffers from Pool, which are not zeroed: gRPC's default pool clears
// every buffer it hands out and rounds a 64 KiB DATA message up to its 1 MiB size class, and profiling the
// agent's bulk path showed a quarter of its CPU time in that memclr. Every byte of a buffer taken from Pool
// is written before it is sent (by the marshaller, by the copy that materializes a message, or by the read
// that filled an OwnedData payload), so nothing stale leaks.
//
// Two DATA fast paths can be turned on, and a third is taken whenever the message is an *OwnedData. Any
// message they do not recognise byte for byte goes through proto.
type Codec struct {
	// AliasReceived: Unmarshal lets a DATA payload alias gRPC's receive buffer instead of copying it out.
	// The buffer is kept (one reference is never released), so gRPC does not recycle it while the packet
	// is in use; the garbage collector frees it with the packet.
	AliasReceived bool
	// ZeroCopySend: Marshal hands a DATA payload to gRPC as it is, behind a few header bytes, instead of
	// copying it into a message buffer. That is only safe when nobody writes into a payload after sending
	// it, which holds for the server (its payloads were received from a peer, or copied out of a CONNECT
	// client's read). A sender that reuses its read buffers (the agent) leaves it off, and gives away the
	// buffers it does not reuse with OwnedData instead.
	ZeroCopySend bool
}

// OwnedData is a DATA packet sent together with the buffer that holds its payload, which the sender gives
// away: it passes an *OwnedData to the stream's SendMsg and never touches Buf again, whether SendMsg
// succeeds or not. Marshal hands Buf to gRPC behind a few header bytes, and gRPC returns it to Pool once the
// bytes are written; when the payload is below ZeroCopyMin, or the packet is not one the fast path encodes
// (unknown fields), Marshal copies the packet as proto would and returns Buf to Pool itself. If SendMsg
// fails before marshalling, Buf is left to the garbage collector. The bytes on the wire are those of
// proto.Marshal(Packet) either way.
type OwnedData struct {
	Packet *client.Packet // a DATA packet whose payload, Data.Data, is exactly *Buf
	Buf    *[]byte        // from Pool
}

var _ encoding.CodecV2 = Codec{}

// Name is "proto", so that the wire format and content type stay those of every gRPC peer.
func (Codec) Name() string { return "proto" }

func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	var m proto.Message
	switch v := v.(type) {
	case *OwnedData:
		if d, ok := zeroCopyData(v.Packet); ok && v.Buf != nil && len(*v.Buf) == len(d.Data) && &(*v.Buf)[0] == &d.Data[0] {
			return mem.BufferSlice{mem.SliceBuffer(dataHeader(d)), mem.NewBuffer(v.Buf, Pool)}, nil
		}
		if v.Buf != nil {
			// The copy below is done with Buf by the time Marshal returns, and nobody else holds it.
			defer Pool.Put(v.Buf)
		}
		if v.Packet == nil {
			return nil, fmt.Errorf("konnectivity codec: OwnedData without a packet")
		}
		m = v.Packet
	case *client.Packet:
		if d, ok := zeroCopyData(v); ok && c.ZeroCopySend {
			return mem.BufferSlice{mem.SliceBuffer(dataHeader(d)), mem.SliceBuffer(d.Data)}, nil
		}
		m = v
	case proto.Message:
		m = v
	default:
		return nil, fmt.Errorf("konnectivity codec: cannot marshal %T", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // safe: Size was just computed
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	bp := Pool.Get(size)
	b, err := opts.MarshalAppend((*bp)[:0], m)
	if err != nil {
		Pool.Put(bp)
		return nil, err
	}
	*bp = b
	return mem.BufferSlice{mem.NewBuffer(bp, Pool)}, nil
}

func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*client.Packet)
	if ok && c.AliasReceived && data.Len() >= ZeroCopyMin {
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
		return fmt.Errorf("konnectivity codec: cannot unmarshal into %T", v)
	}
	buf := data.MaterializeToBuffer(Pool)
	defer buf.Free()
	// proto.Unmarshal copies bytes fields, so the buffer can go back to the pool.
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// zeroCopyData returns p's DATA if dataHeader and the payload encode p exactly: a payload of ZeroCopyMin
// or more, and no unknown fields, which dataHeader would leave out.
func zeroCopyData(p *client.Packet) (*client.Data, bool) {
	if p == nil || p.Type != client.PacketType_DATA {
		return nil, false
	}
	d := p.GetData()
	if d == nil || len(d.Data) < ZeroCopyMin || len(p.ProtoReflect().GetUnknown()) != 0 || len(d.ProtoReflect().GetUnknown()) != 0 {
		return nil, false
	}
	return d, true
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
