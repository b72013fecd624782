package sshflags

import (
	"reflect"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/socks/sshdial"
	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	// A command that owns -p keeps it; the SSH port is then only --ssh-port.
	var port int
	fs.IntVarP(&port, "port", "p", 8001, "")
	f := NewFlags()
	f.AddFlags(fs)
	if fs.ShorthandLookup("p").Name != "port" || fs.ShorthandLookup("J").Name != "jump" {
		t.Fatal("shorthands wrong")
	}
	if err := fs.Parse([]string{"--ssh-port", "2222", "-J", "a,b:23", "-i", "k1", "-i", "k2", "--cipher", "aes128-gcm@openssh.com", "--accept-new"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.Config("me@host")
	if err != nil {
		t.Fatal(err)
	}
	want := sshdial.Config{Destination: "me@host", Port: 2222, JumpHosts: []string{"a", "b:23"}, IdentityFiles: []string{"k1", "k2"},
		AcceptNew: true, ConnectTimeout: sshdial.DefaultConnectTimeout, Ciphers: []string{"aes128-gcm@openssh.com"}, Connections: 1}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Config = %+v\nwant %+v", cfg, want)
	}
	for _, tc := range []struct {
		mutate func(f *Flags)
		dest   string
		want   string
	}{
		{func(f *Flags) {}, "", "destination"},
		{func(f *Flags) { f.Port = -1 }, "h", "--ssh-port"},
		{func(f *Flags) { f.ConnectTimeout = 0 }, "h", "--connect-timeout"},
		{func(f *Flags) { f.Jump = "ok,-bad" }, "h", "--jump"},
		{func(f *Flags) { f.Ciphers = []string{"arcfour"} }, "h", "--cipher"},
	} {
		f := NewFlags()
		tc.mutate(f)
		if _, err := f.Config(tc.dest); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want it to name %q", err, tc.want)
		}
	}
}

func TestConnectionsFlag(t *testing.T) {
	for _, n := range []int{0, -1, sshdial.MaxConnections + 1} {
		f := NewFlags()
		f.Connections = n
		if _, err := f.Config("host"); err == nil || !strings.Contains(err.Error(), "--ssh-connections") {
			t.Errorf("--ssh-connections %d: got %v, want an error naming the flag", n, err)
		}
	}
	f := NewFlags()
	f.Connections = 4
	cfg, err := f.Config("host")
	if err != nil || cfg.Connections != 4 {
		t.Fatalf("--ssh-connections 4: %+v, %v", cfg.Connections, err)
	}
}
