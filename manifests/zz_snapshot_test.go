package manifests

import (
	"os"
	"testing"
)

func TestZZSnapshot(t *testing.T) {
	dir := os.Getenv("SNAP")
	if dir == "" {
		t.Skip()
	}
	ca, _ := testPEM(t, "x")
	_ = ca
	fixed := []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	for i, a := range []Agent{{Image: Image("v1.2.3"), ProxyServerHost: "198.18.0.1"}, {Image: "i", ProxyServerHost: "a,b:1", CACert: fixed}} {
		files, err := a.Render()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			os.WriteFile(dir+"/agent"+string(rune('0'+i))+"-"+f.Name, f.Data, 0o644)
		}
	}
	for i, s := range []Server{grpcServer(), tcpServer()} {
		f, err := s.Render()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(dir+"/server"+string(rune('0'+i))+"-"+f.Name, f.Data, 0o644)
	}
}
