package agentcmd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	upstream "sigs.k8s.io/apiserver-network-proxy/cmd/agent/app/options"
)

// TestFlagsMatchUpstream walks upstream proxy-agent's flags and checks that konnect has each one, with the
// same type and default, so that a user can swap the image and keep the arguments.
func TestFlagsMatchUpstream(t *testing.T) {
	ours := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
	NewOptions().AddFlags(ours)
	theirs := upstream.NewGrpcProxyAgentOptions().Flags()
	n := 0
	theirs.VisitAll(func(f *pflag.Flag) {
		n++
		g := ours.Lookup(f.Name)
		if g == nil {
			t.Errorf("--%s: missing", f.Name)
			return
		}
		if g.Value.Type() != f.Value.Type() {
			t.Errorf("--%s: type %s, upstream %s", f.Name, g.Value.Type(), f.Value.Type())
		}
		if f.Name == "agent-id" {
			// A fresh UUID per process, in both.
			if g.DefValue == "" {
				t.Errorf("--agent-id: empty default")
			}
			return
		}
		if g.DefValue != f.DefValue {
			t.Errorf("--%s: default %q, upstream %q", f.Name, g.DefValue, f.DefValue)
		}
		if g.Shorthand != f.Shorthand {
			t.Errorf("--%s: shorthand %q, upstream %q", f.Name, g.Shorthand, f.Shorthand)
		}
	})
	if n < 25 {
		t.Fatalf("upstream has only %d flags? the walk is broken", n)
	}
}

// TestFlagDefaults pins the defaults that matter, so that a change is deliberate.
func TestFlagDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	for name, want := range map[string]string{
		"proxy-server-host":             "127.0.0.1",
		"proxy-server-port":             "8091",
		"health-server-port":            "8093",
		"health-server-host":            "",
		"admin-server-port":             "8094",
		"admin-bind-address":            "127.0.0.1",
		"sync-interval":                 "1s",
		"sync-interval-cap":             "10s",
		"probe-interval":                "1s",
		"keepalive-time":                "1h0m0s",
		"xfr-channel-size":              "150",
		"allow-destination":             "[]",
		"graceful-timeout":              "20s",
		"dial-timeout":                  "5s",
		"connection-buffer-bytes":       "8388608",
		"connection-stall-timeout":      "5s",
		"read-buffer-bytes":             "1048448",
		"allow-remote-admin":            "false",
		"flow-control":                  "true",
		"flow-control-window-bytes":     "65536",
		"flow-control-max-window-bytes": "4194304",
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s missing", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("--%s default %q, want %q", name, f.DefValue, want)
		}
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // substring of the error; empty means valid
	}{
		{"defaults", nil, ""},
		{"server list", []string{"--proxy-server-host=10.0.0.1,10.0.0.2,[fd00::1]:9000,example.com"}, ""},
		{"port range", []string{"--proxy-server-port=70000"}, "--proxy-server-port"},
		{"empty host", []string{"--proxy-server-host=,"}, "--proxy-server-host"},
		{"bad host port", []string{"--proxy-server-host=a:b"}, "--proxy-server-host"},
		{"missing CA", []string{"--ca-cert=" + filepath.Join(dir, "nope")}, "--ca-cert"},
		{"cert without key", []string{"--agent-cert=" + file}, "--agent-cert and --agent-key"},
		{"missing token", []string{"--service-account-token-path=/nonexistent/token"}, "--service-account-token-path"},
		{"identifiers", []string{"--agent-identifiers=host=n1&cidr=10.0.0.0/8&default-route=true"}, ""},
		{"unknown identifier", []string{"--agent-identifiers=colour=blue"}, "--agent-identifiers"},
		{"addresses", []string{"--agent-identifiers=ipv4=198.18.0.2&ipv6=fd00::2&host=198.18.0.2"}, ""},
		{"not URL-encoded", []string{"--agent-identifiers=host=a;b"}, "--agent-identifiers: not URL-encoded"},
		// Values upstream's agent starts with, though they route nothing: warned of (TestUnroutableIdentifiers).
		{"unexpanded variable", []string{"--agent-identifiers=ipv4=${HOST_IP}"}, ""},
		{"bad default-route", []string{"--agent-identifiers=default-route=maybe"}, ""},
		{"bad cidr", []string{"--agent-identifiers=cidr=notacidr"}, ""},
		{"sync interval over cap", []string{"--sync-interval=20s"}, "--sync-interval"},
		{"contention without profiling", []string{"--enable-contention-profiling"}, "--enable-contention-profiling"},
		{"server count source", []string{"--server-count-source=min"}, "--server-count-source"},
		{"lease label", []string{"--count-server-leases", "--lease-label=a b c"}, "--lease-label"},
		{"allow", []string{"--allow-destination=10.0.0.0/8:443,8443", "--allow-destination=fd00::/8:1-65535"}, ""},
		{"allow without ports", []string{"--allow-destination=10.0.0.0/8"}, "--allow-destination"},
		{"allow bad range", []string{"--allow-destination=10.0.0.0/8:9-1"}, "--allow-destination"},
		{"allow bad cidr", []string{"--allow-destination=10.0.0.0/33:1"}, "--allow-destination"},
		{"xfr", []string{"--xfr-channel-size=0"}, "--xfr-channel-size"},
		{"keepalive 0, as upstream's agent takes it", []string{"--keepalive-time=0"}, ""},
		{"negative keepalive", []string{"--keepalive-time=-1s"}, "--keepalive-time: must not be negative"},
		{"read buffer", []string{"--read-buffer-bytes=100"}, "--read-buffer-bytes"},
		{"health host", []string{"--health-server-host=999.1.1.1"}, "--health-server-host"},
		{"health host name", []string{"--health-server-host=node-1.example"}, ""},
		{"server name with a final dot", []string{"--proxy-server-host=konnectivity-server.kube-system.svc.cluster.local."}, ""},
		{"unspecified server", []string{"--proxy-server-host=0.0.0.0"}, "--proxy-server-host: 0.0.0.0 is the unspecified address"},
		{"unspecified IPv6 server in a list", []string{"--proxy-server-host=10.0.0.1,[::]:8132"}, "--proxy-server-host: :: is the unspecified address"},
		{"multicast server", []string{"--proxy-server-host=224.0.0.1"}, "--proxy-server-host: 224.0.0.1 is a multicast address"},
		{"broadcast server", []string{"--proxy-server-host=255.255.255.255"}, "--proxy-server-host: 255.255.255.255 is the broadcast address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			_, err := o.Config()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestUnroutableIdentifiers: identifiers that upstream's agent accepts but that match no dial are named,
// for a warning, instead of refused: a manifest written for upstream must not leave the drop-in
// crash-looping. An unknown type is refused, as upstream refuses it.
func TestUnroutableIdentifiers(t *testing.T) {
	got, err := validateIdentifiers("ipv4=${HOST_IP}&ipv4=198.18.0.2&ipv4=fd00::1&ipv6=&cidr=10.0.0.1&default-route=yes&host=n1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`cidr="10.0.0.1" is not a CIDR block such as 10.0.0.0/8`,
		`default-route="yes" is not true or false`,
		`ipv4="${HOST_IP}" is not an IPv4 address`,
		`ipv4="fd00::1" is not an IPv4 address`,
		`ipv6="" is not an IPv6 address`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("unroutable:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := validateIdentifiers("colour=blue"); err == nil || !strings.Contains(err.Error(), `unknown identifier type "colour"`) {
		t.Fatalf("unknown type: %v", err)
	}
}

func TestOptionsConfig(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--proxy-server-host=10.0.0.1, server.example:9000", "--proxy-server-port=8132",
		"--allow-destination=10.0.0.0/8:443", "--graceful-timeout=0", "--agent-id=a1", "--sync-forever",
		"--server-count-source=max"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Agent.Servers, " "); got != "10.0.0.1:8132 server.example:9000" {
		t.Errorf("servers %q", got)
	}
	if cfg.Agent.AgentID != "a1" || !cfg.Agent.SyncForever || !cfg.Agent.ServerCountMax || cfg.Agent.GracefulTimeout != 0 {
		t.Errorf("config %+v", cfg)
	}
	if len(cfg.Agent.Allow) != 1 || cfg.Agent.Allow[0].String() != "10.0.0.0/8:443" {
		t.Errorf("allow %v", cfg.Agent.Allow)
	}
	if cfg.Agent.SyncInterval != time.Second || cfg.Agent.SyncIntervalCap != 10*time.Second {
		t.Errorf("sync %v/%v", cfg.Agent.SyncInterval, cfg.Agent.SyncIntervalCap)
	}
}

// TestValidateKeepsCause: the flag is named and the cause is still there for errors.Is.
func TestValidateKeepsCause(t *testing.T) {
	o := NewOptions()
	o.Upstream.CaCert = filepath.Join(t.TempDir(), "missing.crt")
	err := o.Validate()
	if err == nil || !strings.Contains(err.Error(), "--ca-cert") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Validate() = %v, want an error naming --ca-cert that is fs.ErrNotExist", err)
	}
}
