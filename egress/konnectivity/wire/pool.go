package wire

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// sizeClassPool is a mem.BufferPool with power-of-two size classes and no zeroing.
type sizeClassPool struct {
	classes [maxClass - minClass + 1]sync.Pool
}

const (
	minClass = 8  // 256 B
	maxClass = 24 // 16 MiB; larger buffers are not pooled
)

// Pool is a mem.BufferPool that does not zero its buffers, for Codec and for gRPC's transport
// (experimental.WithBufferPool, grpc.BufferPool).
var Pool mem.BufferPool = &sizeClassPool{}

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
