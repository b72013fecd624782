package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
	"testing"
	"time"
)

// TestTLSHandshakes uses the certificates the way the Konnectivity server, its agents, kube-apiserver and
// extension API servers do: mutual TLS over loopback, with each side trusting only the CA it should.
func TestTLSHandshakes(t *testing.T) {
	cfg := testConfig(t)
	mustEnsure(t, cfg)
	dir := cfg.PKIDir()
	pair := func(name string) tls.Certificate {
		s := specByName(t, name)
		c, err := tls.LoadX509KeyPair(s.CertFile(dir), s.KeyFile(dir))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pool := func(name string) *x509.CertPool {
		data, err := os.ReadFile(specByName(t, name).CertFile(dir))
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(data)
		return p
	}
	for _, tc := range []struct {
		name       string
		server     string // serving certificate
		clientCAs  string // CA the server requires client certificates from
		client     string
		rootCA     string
		serverName string
		ok         bool
	}{
		{"agent to server, by address", KonnectivityServer, KonnectivityAgentCA, KonnectivityAgent, CA, "198.18.0.1", true},
		{"agent to server, by name", KonnectivityServer, KonnectivityAgentCA, KonnectivityAgent, CA, "cp.example.test", true},
		{"agent to server, by hostname", KonnectivityServer, KonnectivityAgentCA, KonnectivityAgent, CA, "node-1", true},
		// kube-apiserver's --client-ca-file is the cluster CA: the agents' certificate is no credential there.
		{"agent certificate where the cluster CA is required", KonnectivityServer, CA, KonnectivityAgent, CA, "localhost", false},
		{"kube-apiserver to frontend", KonnectivityFrontend, CA, APIServerEgressClient, CA, "127.0.0.1", true},
		{"kube-apiserver to extension server", KonnectivityServer, FrontProxyCA, FrontProxyClient, CA, "localhost", true},
		{"wrong name", KonnectivityServer, KonnectivityAgentCA, KonnectivityAgent, CA, "198.18.0.99", false},
		{"front-proxy client where the cluster CA is required", KonnectivityServer, CA, FrontProxyClient, CA, "localhost", false},
		{"cluster client where the front-proxy CA is required", KonnectivityServer, FrontProxyCA, KonnectivityServerClient, CA, "localhost", false},
		{"server checked against the front-proxy CA", KonnectivityServer, KonnectivityAgentCA, KonnectivityAgent, FrontProxyCA, "localhost", false},
		{"client certificate used to serve", KonnectivityAgent, CA, KonnectivityServerClient, CA, "localhost", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
				Certificates: []tls.Certificate{pair(tc.server)},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pool(tc.clientCAs),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			serverErr := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					serverErr <- err
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err != nil {
					serverErr <- err
					return
				}
				_, err = c.Write([]byte("ok"))
				serverErr <- err
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d := tls.Dialer{Config: &tls.Config{
				Certificates: []tls.Certificate{pair(tc.client)},
				RootCAs:      pool(tc.rootCA),
				ServerName:   tc.serverName,
			}}
			conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			var got []byte
			if err == nil {
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				got, err = io.ReadAll(conn)
				conn.Close()
			}
			sErr := <-serverErr
			ok := err == nil && sErr == nil && string(got) == "ok"
			if ok != tc.ok {
				t.Fatalf("handshake ok=%v, want %v (client: %v, server: %v)", ok, tc.ok, err, sErr)
			}
		})
	}
}
