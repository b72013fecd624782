// Command relay is the ceiling of the tunnel bulk benchmark: the tunnel's hops and crypto with plain relays
// and no gRPC. In front it listens on a Unix socket, as the tunnel server does, and forwards each connection
// over mutual TLS (TLS 1.3, Go's defaults, the tunnel's certificates) to its far end, which forwards it over
// TCP to the backend, as the agent does:
//
//	relay --listen unix:/run/x.sock --to tls:198.18.0.2:8140 --ca ca.crt --cert agent.crt --key agent.key --server-name 198.18.0.1
//	relay --listen tls:198.18.0.2:8140 --to tcp:198.19.0.10:8080 --ca ca.crt --cert server.crt --key server.key
//
// Each direction is one copy loop with a 256 KiB buffer. TLS records are written in batches (the records of
// one Write leave in one syscall) and read through 128 KiB, like the tunnel's agent link, so that the
// ceiling measures the hops and the crypto, not a syscall per 16 KiB record.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

func main() {
	listen := flag.String("listen", "", "unix:PATH or tls:HOST:PORT")
	to := flag.String("to", "", "tls:HOST:PORT or tcp:HOST:PORT")
	caFile := flag.String("ca", "", "CA certificate that signs the peer's certificate")
	certFile := flag.String("cert", "", "this end's certificate")
	keyFile := flag.String("key", "", "this end's key")
	serverName := flag.String("server-name", "", "with --to tls: the name (or IP) the far end's certificate must carry")
	flag.Parse()
	lnet, laddr, ok1 := strings.Cut(*listen, ":")
	tnet, taddr, ok2 := strings.Cut(*to, ":")
	if !ok1 || !ok2 || (lnet != "unix" && lnet != "tls") || (tnet != "tls" && tnet != "tcp") {
		log.Fatalf("relay: --listen unix:PATH|tls:ADDR and --to tls:ADDR|tcp:ADDR are required")
	}
	var cfg *tls.Config
	if lnet == "tls" || tnet == "tls" {
		var err error
		if cfg, err = tlsConfig(*caFile, *certFile, *keyFile); err != nil {
			log.Fatalf("relay: %v", err)
		}
	}
	var ln net.Listener
	var err error
	if lnet == "unix" {
		_ = os.Remove(laddr)
		ln, err = net.Listen("unix", laddr)
	} else {
		ln, err = net.Listen("tcp", laddr)
	}
	if err != nil {
		log.Fatalf("relay: --listen: %v", err)
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Fatalf("relay: accept: %v", err)
		}
		go func() {
			if err := serve(c, lnet, tnet, taddr, cfg, *serverName); err != nil {
				log.Printf("relay: %v", err)
			}
		}()
	}
}

func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca: no certificate in %s", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--cert/--key: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool,
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}, nil
}

// batchConn holds TLS records back until Flush once batching is on (after the handshake).
type batchConn struct {
	net.Conn
	r        *bufio.Reader
	w        *bufio.Writer
	batching bool
}

func newBatchConn(c net.Conn) *batchConn {
	return &batchConn{Conn: c, r: bufio.NewReaderSize(c, 128<<10), w: bufio.NewWriterSize(c, 256<<10)}
}

func (b *batchConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *batchConn) Write(p []byte) (int, error) {
	if !b.batching {
		return b.Conn.Write(p)
	}
	return b.w.Write(p)
}

// flushing is a TLS connection whose every Write leaves in one batch.
type flushing struct {
	*tls.Conn
	b *batchConn
}

func (f *flushing) Write(p []byte) (int, error) {
	n, err := f.Conn.Write(p)
	if err != nil {
		return n, err
	}
	return n, f.b.w.Flush()
}

func (f *flushing) CloseWrite() error {
	if err := f.Conn.CloseWrite(); err != nil {
		return err
	}
	return f.b.w.Flush()
}

func wrapTLS(raw net.Conn, cfg *tls.Config, client bool) (net.Conn, error) {
	b := newBatchConn(raw)
	var c *tls.Conn
	if client {
		c = tls.Client(b, cfg)
	} else {
		c = tls.Server(b, cfg)
	}
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	b.batching = true
	return &flushing{Conn: c, b: b}, nil
}

func serve(in net.Conn, lnet, tnet, taddr string, cfg *tls.Config, serverName string) error {
	if lnet == "tls" {
		peer := in.RemoteAddr()
		var err error
		if in, err = wrapTLS(in, cfg, false); err != nil {
			return fmt.Errorf("TLS handshake with %s: %w", peer, err)
		}
	}
	raw, err := net.Dial("tcp", taddr)
	if err != nil {
		in.Close()
		return err
	}
	out := raw
	if tnet == "tls" {
		c := cfg.Clone()
		c.ServerName = serverName
		if out, err = wrapTLS(raw, c, true); err != nil {
			in.Close()
			return fmt.Errorf("TLS handshake with %s: %w", taddr, err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pipe(out, in) }()
	pipe(in, out)
	wg.Wait()
	in.Close()
	out.Close()
	return nil
}

// pipe copies src to dst and then half-closes dst, or closes both on an error.
func pipe(dst, src net.Conn) {
	_, err := io.CopyBuffer(onlyWriter{dst}, onlyReader{src}, make([]byte, 256<<10))
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	src.Close()
}

// onlyReader and onlyWriter hide ReadFrom and WriteTo, so that every copy goes through the buffer above.
type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }
