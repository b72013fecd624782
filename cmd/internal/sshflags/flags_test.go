package sshflags

import (
	"reflect"
	"slices"
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
	if err := fs.Parse([]string{"--ssh-port", "2222", "-J", "a,b:23", "-i", "k1", "-i", "keys,old/k2", "--cipher", "aes128-gcm@openssh.com", "--accept-new"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.Config("me@host")
	if err != nil {
		t.Fatal(err)
	}
	want := sshdial.Config{Destination: "me@host", Port: 2222, JumpHosts: []string{"a", "b:23"}, IdentityFiles: []string{"k1", "keys,old/k2"},
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

// -4 and -6 choose the address family of the connection to the SSH server, as OpenSSH's do; without them
// the SSH config file's AddressFamily decides.
func TestAddressFamilyFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{{nil, ""}, {[]string{"-4"}, "inet"}, {[]string{"-6"}, "inet6"}, {[]string{"--ipv4"}, "inet"}} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		f := NewFlags()
		f.AddFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.Config("me@host")
		if err != nil || cfg.AddressFamily != c.want {
			t.Errorf("%v: AddressFamily %q, %v; want %q", c.args, cfg.AddressFamily, err, c.want)
		}
	}
}

// ssh's own flags parse, so that an `ssh -D 1080 -N host` line can be pasted: -N and -C run (-C with a
// notice, see Notice), the others are refused with an error that names the flag and says what to do instead.
func TestSSHHabits(t *testing.T) {
	parse := func(t *testing.T, args ...string) (*Flags, error) {
		t.Helper()
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		f := NewFlags()
		f.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		_, err := f.Config("me@host")
		return f, err
	}
	for _, args := range [][]string{{"-N"}, {"-C"}, {"-q"}, {"-NCq"}, {"--no-command", "--compression", "--quiet"}} {
		f, err := parse(t, args...)
		if err != nil {
			t.Errorf("%v: %v", args, err)
		}
		if g := f.Given(); slices.Contains(g, "--quiet") {
			t.Errorf("%v: Given reports -q, which is no SSH option: %v", args, g)
		}
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-f"}, []string{"-f (--background)", "foreground", "&", "systemd"}},
		{[]string{"-N", "-f"}, []string{"-f (--background)"}},
		{[]string{"-4", "-6"}, []string{"-6 (--ipv6)", "conflicts with -4 (--ipv4)"}},
		{[]string{"-o", "AddressFamily=inet"}, []string{`-o (--ssh-option "AddressFamily=inet")`, "-4 (--ipv4) for inet", "put AddressFamily in the SSH config file"}},
		{[]string{"-o", "ServerAliveInterval=30"}, []string{`-o (--ssh-option "ServerAliveInterval=30"): not supported`, "--server-alive-interval", "put ServerAliveInterval in the SSH config file", "-F FILE"}},
		{[]string{"-o", "StrictHostKeyChecking=accept-new"}, []string{"-o (--ssh-option \"", "--accept-new"}},
		{[]string{"-o", "IdentitiesOnly yes"}, []string{"-o (--ssh-option \"", "put IdentitiesOnly in the SSH config file", "~/.ssh/config"}},
		{[]string{"-o", "ExitOnForwardFailure=yes"}, []string{"-o (--ssh-option \"", "does not read ExitOnForwardFailure"}},
	} {
		if _, err := parse(t, c.args...); err == nil {
			t.Errorf("%v: no error", c.args)
		} else {
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: %v; want it to say %q", c.args, err, w)
				}
			}
		}
	}
	// A command that owns a letter keeps it; the long name still works.
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.BoolP("force", "f", false, "")
	f := NewFlags()
	f.AddFlags(fs)
	if fs.ShorthandLookup("f").Name != "force" || fs.Lookup("background") == nil {
		t.Fatal("-f taken from the command")
	}
}
