package agent

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// wireCodec is gRPC's protobuf encoding with buffers that are not zeroed. gRPC's default pool clears every
// buffer it hands out, and rounds a 64 KiB DATA message up to its 1 MiB size class: profiling the agent's
// bulk path showed a quarter of its CPU time in that memclr. Every byte of a buffer taken here is
// overwritten (by the marshaller, or by the copy that materializes a message), so nothing stale can leak.
//
// It registers under the name "proto", so the wire format and content type stay those of every gRPC peer.
type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a protobuf message", v)
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
	bp := dirtyPool.Get(size)
	b, err := opts.MarshalAppend((*bp)[:0], m)
	if err != nil {
		dirtyPool.Put(bp)
		return nil, err
	}
	*bp = b
	return mem.BufferSlice{mem.NewBuffer(bp, dirtyPool)}, nil
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(dirtyPool)
	defer buf.Free()
	// proto.Unmarshal copies bytes fields, so the buffer can go back to the pool.
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// sizeClassPool is a mem.BufferPool with power-of-two size classes and no zeroing.
type sizeClassPool struct {
	classes [maxClass - minClass + 1]sync.Pool
}

const (
	minClass = 8  // 256 B
	maxClass = 24 // 16 MiB; larger buffers are not pooled
)

var dirtyPool = &sizeClassPool{}

func class(n int) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len(uint(n - 1))
}

func (p *sizeClassPool) Get(n int) *[]byte {
	c := class(n)
	if c > maxClass {
		b := make([]byte, n)
		return &b
	}
	if bp, ok := p.classes[c-minClass].Get().(*[]byte); ok {
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n, 1<<c)
	return &b
}

func (p *sizeClassPool) Put(bp *[]byte) {
	c := cap(*bp)
	if c < 1<<minClass || c > 1<<maxClass || c&(c-1) != 0 {
		return // not one of ours
	}
	p.classes[bits.Len(uint(c))-1-minClass].Put(bp)
}
