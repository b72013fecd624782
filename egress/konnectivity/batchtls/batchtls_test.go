package batchtls

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/konnect-dev/konnect/pki/pkitest"
	"github.com/konnect-dev/konnect/test/harness"
	grpccreds "google.golang.org/grpc/credentials"
)

// tlsPair returns both ends of a TLS connection over loopback TCP, made with gRPC's TLS credentials,
// batched or not.
func tlsPair(tb testing.TB, batched bool) (client, server net.Conn) {
	tb.Helper()
	ca := pkitest.NewCA(tb, "test-ca")
	serving := ca.Server(tb, "localhost", "localhost")
	var cc, sc grpccreds.TransportCredentials = grpccreds.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}),
		grpccreds.NewTLS(&tls.Config{Certificates: []tls.Certificate{serving.TLS()}})
	if batched {
		cc, sc = batchTLS{cc}, batchTLS{sc}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		c, _, err := sc.ServerHandshake(raw)
		ch <- res{c, err}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	client, _, err = cc.ClientHandshake(context.Background(), "localhost", raw)
	if err != nil {
		tb.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		tb.Fatal(r.err)
	}
	tb.Cleanup(func() { client.Close(); r.c.Close() })
	return client, r.c
}

// TestBatchTLS checks that batching under TLS delivers every byte in order, in both directions at once,
// for writes from one byte to several MiB (more than one batch).
func TestBatchTLS(t *testing.T) {
	c, s := tlsPair(t, true)
	sizes := []int{1, 100, 16 << 10, 16<<10 + 1, 256 << 10, 3<<20 + 7}
	var want bytes.Buffer
	for _, n := range sizes {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		want.Write(b)
	}
	errc := make(chan error, 2)
	send := func(w net.Conn) {
		data := want.Bytes()
		for _, n := range sizes {
			if _, err := w.Write(data[:n]); err != nil {
				errc <- err
				return
			}
			data = data[n:]
		}
		errc <- nil
	}
	go send(c)
	go send(s)
	for _, r := range []net.Conn{s, c} {
		got := make([]byte, want.Len())
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatal("bytes differ after the TLS round trip")
		}
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	// A close after batched writes still reaches the peer as EOF.
	c.Close()
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want EOF", err)
	}
}

// BenchmarkBatchTLS moves data over TLS on loopback in gRPC-sized writes (the transport's 256 KiB buffer),
// with crypto/tls writing each record itself ("plain") and with records batched under TLS.
//
//	go test -run '^$' -bench BatchTLS ./egress/konnectivity/batchtls
func BenchmarkBatchTLS(b *testing.B) {
	for _, batched := range []bool{false, true} {
		name := "plain"
		if batched {
			name = "batched"
		}
		b.Run(name, func(b *testing.B) {
			c, s := tlsPair(b, batched)
			const chunk = 256 << 10
			buf := make([]byte, chunk)
			done := make(chan error, 1)
			go func() {
				_, err := io.CopyBuffer(io.Discard, s, make([]byte, 256<<10))
				done <- err
			}()
			b.SetBytes(chunk)
			defer harness.ReportCPU(b, chunk)()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.Close()
			<-done
		})
	}
}
