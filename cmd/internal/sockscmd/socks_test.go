package sockscmd

import (
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

// childEnv makes the test binary run `konnect socks` with its arguments (see TestMain).
const childEnv = "KONNECT_SOCKS_CHILD"

func TestMain(m *testing.M) {
	// The process tests and the benchmark run `konnect socks` as its own process: this binary, re-executed.
	// KONNECT_CPUPROFILE=FILE profiles that process (it is written when konnect exits on SIGTERM).
	if os.Getenv(childEnv) == "1" {
		if f := os.Getenv("KONNECT_CPUPROFILE"); f != "" {
			if out, err := os.Create(f); err == nil {
				pprof.StartCPUProfile(out)
			}
		}
		cmd := NewSocksCommand()
		cmd.SetArgs(os.Args[1:])
		err := cmd.Execute()
		pprof.StopCPUProfile()
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction(harness.SpawnerFunc),
	)
}

func TestFlagDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("socks", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	want := map[string]string{
		"dynamic-forward":       "localhost:1080",
		"http-listen":           "",
		"health-listen":         "",
		"allow-remote":          "false",
		"proxy-user":            "",
		"proxy-password-file":   "",
		"max-connections":       "1024",
		"ssh-port":              "0",
		"ssh-user":              "",
		"identity":              "[]",
		"jump":                  "",
		"ssh-config":            "",
		"known-hosts":           "",
		"accept-new":            "false",
		"connect-timeout":       "15s",
		"server-alive-interval": "0s",
		"cipher":                "[]",
		"ssh-connections":       "1",
		"retry-first":           "false",
		"allow-unprotected-key": "false",
		// ssh's own flags, taken so that an ssh -D line can be pasted.
		"no-command":  "false",
		"quiet":       "false",
		"compression": "false",
		"ipv4":        "false",
		"ipv6":        "false",
		"background":  "false",
		"ssh-option":  "[]",
	}
	got := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { got[f.Name] = f.DefValue })
	for name, def := range want {
		if got[name] != def {
			t.Errorf("--%s default = %q, want %q", name, got[name], def)
		}
	}
	if len(got) != len(want) {
		t.Errorf("flags = %v, want exactly %v", got, want)
	}
	for short, long := range map[string]string{"D": "dynamic-forward", "p": "ssh-port", "l": "ssh-user", "i": "identity", "J": "jump", "F": "ssh-config",
		"N": "no-command", "q": "quiet", "C": "compression", "4": "ipv4", "6": "ipv6", "f": "background", "o": "ssh-option"} {
		if f := fs.ShorthandLookup(short); f == nil || f.Name != long {
			t.Errorf("-%s is not --%s", short, long)
		}
	}
}

func TestOptionsConfig(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	os.WriteFile(pwFile, []byte("s3cret\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	readable := filepath.Join(dir, "readable")
	os.WriteFile(readable, []byte("s3cret\n"), 0o644)
	for _, tc := range []struct {
		name    string
		set     func(o *Options)
		dest    string
		wantErr string
		check   func(t *testing.T, c *Config)
	}{
		{"bare port binds loopback", func(o *Options) { o.DynamicForward = "1081" }, "h", "", func(t *testing.T, c *Config) {
			if c.SOCKSAddr != "localhost:1081" {
				t.Errorf("addr %q", c.SOCKSAddr)
			}
		}},
		{"ipv6 loopback", func(o *Options) { o.DynamicForward = "[::1]:1080" }, "h", "", func(t *testing.T, c *Config) {
			if c.SOCKSAddr != "[::1]:1080" {
				t.Errorf("addr %q", c.SOCKSAddr)
			}
		}},
		{"all interfaces refused", func(o *Options) { o.DynamicForward = "*:1080" }, "h", "-D: refusing", nil},
		{"remote http-listen refused", func(o *Options) { o.HTTPListen = "0.0.0.0:3128" }, "h", "--http-listen: refusing", nil},
		{"allow-remote needs credentials", func(o *Options) { o.DynamicForward = "0.0.0.0:1080"; o.AllowRemote = true }, "h", "--proxy-user", nil},
		{"allow-remote with credentials", func(o *Options) {
			o.DynamicForward = "0.0.0.0:1080"
			o.AllowRemote = true
			o.ProxyUser = "u"
			o.ProxyPasswordFile = pwFile
		}, "h", "", func(t *testing.T, c *Config) {
			if c.Credentials == nil || c.Credentials.User != "u" || c.Credentials.Password != "s3cret" {
				t.Errorf("credentials %+v", c.Credentials)
			}
		}},
		{"user without password file", func(o *Options) { o.ProxyUser = "u" }, "h", "--proxy-password-file", nil},
		{"empty password", func(o *Options) { o.ProxyUser = "u"; o.ProxyPasswordFile = empty }, "h", "--proxy-password-file", nil},
		{"missing password file", func(o *Options) { o.ProxyUser = "u"; o.ProxyPasswordFile = filepath.Join(dir, "nope") }, "h", "--proxy-password-file", nil},
		{"password file others may read", func(o *Options) { o.ProxyUser = "u"; o.ProxyPasswordFile = readable }, "h",
			"--proxy-password-file: permissions 0644 for " + readable + " are too open", nil},
		{"bad port", func(o *Options) { o.DynamicForward = "127.0.0.1:http" }, "h", "-D: port", nil},
		{"port out of range", func(o *Options) { o.DynamicForward = "70000" }, "h", "-D: port", nil},
		{"bad max-connections", func(o *Options) { o.MaxConnections = 0 }, "h", "--max-connections", nil},
		{"max-connections too few with credentials", func(o *Options) {
			o.ProxyUser = "u"
			o.ProxyPasswordFile = pwFile
			o.MaxConnections = 3
		}, "h", "--max-connections: must be at least 4 with --proxy-user", nil},
		{"max-connections few with credentials", func(o *Options) {
			o.ProxyUser = "u"
			o.ProxyPasswordFile = pwFile
			o.MaxConnections = 4
		}, "h", "", nil},
		{"max-connections one without credentials", func(o *Options) { o.MaxConnections = 1 }, "h", "", nil},
		{"bad ssh port", func(o *Options) { o.SSH.Port = 70000 }, "h", "--ssh-port", nil},
		{"bad cipher", func(o *Options) { o.SSH.Ciphers = []string{"rot13"} }, "h", "--cipher", nil},
		{"bad jump", func(o *Options) { o.SSH.Jump = "a,-oProxyCommand=x" }, "h", "--jump", nil},
		{"bad destination", func(o *Options) {}, "-oProxyCommand=x", "invalid host", nil},
		{"bad connect-timeout", func(o *Options) { o.SSH.ConnectTimeout = 0 }, "h", "--connect-timeout", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.set(o)
			o.Destination = tc.dest
			if err := o.Validate(); (err != nil) != (tc.wantErr != "") {
				t.Fatalf("Validate = %v, want error %v", err, tc.wantErr != "")
			}
			c, err := o.Config()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}
