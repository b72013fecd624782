// Package batchtls is the transport of the tunnel's agent link, used by both ends (konnect server and konnect
// agent): gRPC's TLS credentials with a buffer under TLS, so that the records of one write leave together.
// The bytes on the wire are exactly TLS's, so peers that do not batch (upstream proxy-server and
// proxy-agent) are unaffected. It is not a general TLS wrapper: it assumes gRPC's pattern of whole-message
// writes.
package batchtls

import (
	"bufio"
	"context"
	"net"
	"sync"

	grpccreds "google.golang.org/grpc/credentials"
)

// crypto/tls writes every record (at most 16 KiB of payload) with its own write system call, and reads
// about one record per read. Profiling the bulk path showed the agent link's read and write system calls
// as the largest single cost after encryption. batchTLS puts a buffer under TLS, so that one gRPC write
// of many records leaves in one system call and reads fetch many records at once. The bytes on the wire
// are the same. A batch is flushed at 64 KiB, the most loopback and TSO move as one segment, so that the
// receiver can start decrypting while the sender encrypts the rest of a large write.
const (
	batchReadBuffer = 128 << 10
	batchMaxWrite   = 64 << 10
)

// Credentials wraps TLS transport credentials (credentials.NewTLS) so that the connection under TLS batches
// records and the connection above it flushes the batch once each write is done.
func Credentials(tlsCreds grpccreds.TransportCredentials) grpccreds.TransportCredentials {
	return batchTLS{tlsCreds}
}

type batchTLS struct {
	grpccreds.TransportCredentials
}

func (b batchTLS) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, grpccreds.AuthInfo, error) {
	bc := newBatchConn(raw)
	c, info, err := b.TransportCredentials.ClientHandshake(ctx, authority, bc)
	if err != nil {
		return nil, nil, err
	}
	return &flushConn{Conn: c, bc: bc}, info, nil
}

func (b batchTLS) ServerHandshake(raw net.Conn) (net.Conn, grpccreds.AuthInfo, error) {
	bc := newBatchConn(raw)
	c, info, err := b.TransportCredentials.ServerHandshake(bc)
	if err != nil {
		return nil, nil, err
	}
	return &flushConn{Conn: c, bc: bc}, info, nil
}

func (b batchTLS) Clone() grpccreds.TransportCredentials {
	return batchTLS{b.TransportCredentials.Clone()}
}

// batchConn is the plain connection under TLS: reads go through a buffer, and writes made while a
// flushConn write is in progress are gathered and written together when it ends.
type batchConn struct {
	net.Conn
	rd *bufio.Reader

	mu    sync.Mutex
	depth int // flushConn writes in progress
	buf   []byte
	err   error // sticky: a failed batched write leaves the TLS stream broken
}

func newBatchConn(c net.Conn) *batchConn {
	return &batchConn{Conn: c, rd: bufio.NewReaderSize(c, batchReadBuffer)}
}

func (c *batchConn) Read(p []byte) (int, error) { return c.rd.Read(p) }

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.depth > 0 {
		// TLS reuses p for its next record: keep a copy.
		c.buf = append(c.buf, p...)
		if len(c.buf) >= batchMaxWrite {
			if err := c.flushLocked(); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	}
	if err := c.flushLocked(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *batchConn) begin() {
	c.mu.Lock()
	c.depth++
	c.mu.Unlock()
}

func (c *batchConn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.depth--
	if c.depth > 0 {
		return c.err
	}
	return c.flushLocked()
}

func (c *batchConn) flushLocked() error {
	if c.err != nil {
		return c.err
	}
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
	}
	return err
}

// flushConn is the TLS connection handed to gRPC: each write ends with the batch below it written out.
type flushConn struct {
	net.Conn
	bc *batchConn
}

func (c *flushConn) Write(p []byte) (int, error) {
	c.bc.begin()
	n, err := c.Conn.Write(p)
	if ferr := c.bc.end(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}
