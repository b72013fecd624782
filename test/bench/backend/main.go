// Command backend is the far end of konnect's benchmarks: GET /bytes?n=N streams N zero bytes, GET /small
// answers a few bytes, POST /sink?rate=R&slow=D reads the body at R bytes per second for D and then as fast
// as it can and answers how many bytes it read, and --tls serves the same over HTTPS with a throwaway
// certificate (the static HTTPS backend of the API-proxy benchmark).
package main

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
)

var zeros = make([]byte, 256<<10)

func serveBytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "n: want a byte count", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	for n > 0 {
		chunk := zeros
		if int64(len(chunk)) > n {
			chunk = chunk[:n]
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
		n -= int64(len(chunk))
	}
}

// serveSink is a slow consumer: the uploads of the head-of-line benchmark.
func serveSink(w http.ResponseWriter, r *http.Request) {
	rate, err1 := strconv.Atoi(r.URL.Query().Get("rate"))
	slow, err2 := time.ParseDuration(r.URL.Query().Get("slow"))
	if err1 != nil || err2 != nil || rate <= 0 {
		http.Error(w, "rate: bytes per second, slow: a duration", http.StatusBadRequest)
		return
	}
	until := time.Now().Add(slow)
	buf := make([]byte, 256<<10)
	var n int64
	for {
		b := buf
		if time.Now().Before(until) {
			b = buf[:8<<10]
		}
		k, err := r.Body.Read(b)
		n += int64(k)
		if err != nil {
			break
		}
		if time.Now().Before(until) {
			time.Sleep(time.Duration(float64(time.Second) * float64(k) / float64(rate)))
		}
	}
	_, _ = w.Write([]byte(strconv.FormatInt(n, 10)))
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	useTLS := flag.Bool("tls", false, "serve HTTPS with a self-signed certificate")
	certOut := flag.String("cert-out", "", "with --tls: write the self-signed certificate (PEM) here, for clients to trust")
	flag.Parse()

	mux := http.NewServeMux()
	mux.HandleFunc("/bytes", serveBytes)
	mux.HandleFunc("/sink", serveSink)
	small := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"APIVersions","versions":["v1"]}` + "\n"))
	}
	mux.HandleFunc("/small", small)
	mux.HandleFunc("/api", small)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("backend: --listen: %v", err)
	}
	if *useTLS {
		cert, err := selfSigned()
		if err != nil {
			log.Fatalf("backend: certificate: %v", err)
		}
		if *certOut != "" {
			pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
			if err := os.WriteFile(*certOut, pemBytes, 0o644); err != nil {
				log.Fatalf("backend: --cert-out: %v", err)
			}
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Print(err)
		os.Exit(1)
	}
}

func selfSigned() (tls.Certificate, error) {
	c, err := pkitest.Issue(nil, pkitest.Spec{CN: "bench-backend", Hosts: []string{"127.0.0.1", "localhost"}, Server: true})
	if err != nil {
		return tls.Certificate{}, err
	}
	return c.TLS(), nil
}
