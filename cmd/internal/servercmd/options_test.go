package servercmd

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/test/harness"
	"github.com/spf13/pflag"
	upstream "sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
)

// TestFlagsMatchUpstream: every proxy-server v0.36.0 flag exists with the same type and default, except the
// deliberate differences listed here, so a manifest written for proxy-server keeps working.
func TestFlagsMatchUpstream(t *testing.T) {
	// PROXY_SERVER_ID would make both sides take the same value; a random UUID would differ.
	t.Setenv("PROXY_SERVER_ID", "fixed-id")
	theirs := upstream.NewProxyRunOptions().Flags()
	ours := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
	NewOptions().AddFlags(ours)
	// konnect's defaults that differ from upstream's, each said in the flag's help and README.md.
	differs := map[string]string{"backend-dial-timeout": "30s"}
	n := 0
	theirs.VisitAll(func(f *pflag.Flag) {
		n++
		o := ours.Lookup(f.Name)
		if o == nil {
			t.Errorf("--%s missing", f.Name)
			return
		}
		if def, ok := differs[f.Name]; ok {
			if o.Value.Type() != f.Value.Type() || o.DefValue != def || f.DefValue == def {
				t.Errorf("--%s: ours %q, upstream %q; want ours %q, unlike upstream", f.Name, o.DefValue, f.DefValue, def)
			}
			if !strings.Contains(o.Usage, "upstream proxy-server's default is 0") {
				t.Errorf("--%s: help does not say how it differs from upstream: %q", f.Name, o.Usage)
			}
			return
		}
		if o.Value.Type() != f.Value.Type() || o.DefValue != f.DefValue {
			t.Errorf("--%s: ours %s %q, upstream %s %q", f.Name, o.Value.Type(), o.DefValue, f.Value.Type(), f.DefValue)
		}
		if o.Deprecated != f.Deprecated {
			t.Errorf("--%s: deprecation differs", f.Name)
		}
	})
	if n < 40 {
		t.Fatalf("upstream has only %d flags; the walk is broken", n)
	}
	// Pinned here so that a change of upstream version is a deliberate act.
	for name, def := range map[string]string{
		"mode": "grpc", "server-port": "8090", "agent-port": "8091", "health-port": "8092", "admin-port": "8095",
		"admin-bind-address": "127.0.0.1", "delete-existing-uds-file": "true", "proxy-strategies": "default",
		"keepalive-time": "1h0m0s", "xfr-channel-size": "10", "server-count": "1", "graceful-shutdown-timeout": "0s",
		"graceful-timeout": "15s", "allow-remote-admin": "false", "stalled-reader-timeout": "5s",
		"backend-dial-timeout": "30s", "max-pending-dials": "2000",
		"flow-control": "true", "flow-control-window-bytes": "65536", "flow-control-max-window-bytes": "4194304",
		"allow-unauthenticated-agents": "false", "agent-auth-timeout": "10s", "max-unauthenticated-agent-connections": "1024",
		"max-unauthenticated-agent-connections-per-source": "64", "token-review-cache-ttl": "10s", "max-concurrent-token-reviews": "32",
	} {
		if f := ours.Lookup(name); f == nil || f.DefValue != def {
			t.Errorf("--%s default: got %v, want %q", name, f, def)
		}
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, []byte("x"), 0o600)
	valid := func(o *Options) {
		o.Upstream.UdsName = filepath.Join(dir, "s.sock")
		o.Upstream.ServerPort = 0
		o.Upstream.ClusterCert, o.Upstream.ClusterKey, o.Upstream.ClusterCaCert = file, file, file
	}
	tokenAuth := func(o *Options) {
		o.Upstream.ClusterCaCert = ""
		o.Upstream.AgentNamespace, o.Upstream.AgentServiceAccount, o.Upstream.AuthenticationAudience = "a", "b", "c"
		o.Upstream.KubeconfigPath = file
	}
	for _, tc := range []struct {
		name string
		mut  func(*Options)
		want string // "" means valid
	}{
		{"ok", func(*Options) {}, ""},
		{"mode", func(o *Options) { o.Upstream.Mode = "socks" }, "--mode"},
		{"missing cluster key", func(o *Options) { o.Upstream.ClusterKey = "" }, "--cluster-cert and --cluster-key"},
		{"no cluster cert", func(o *Options) { o.Upstream.ClusterCert, o.Upstream.ClusterKey = "", "" }, "--cluster-cert and --cluster-key are required"},
		{"cluster cert absent", func(o *Options) { o.Upstream.ClusterCert = filepath.Join(dir, "nope") }, "--cluster-cert"},
		{"relative socket", func(o *Options) { o.Upstream.UdsName = "s.sock" }, `--uds-name: unix socket path "s.sock" must be absolute`},
		{"socket path too long", func(o *Options) { o.Upstream.UdsName = "/" + strings.Repeat("s", 107) }, "--uds-name: unix socket path"},
		{"uds with server port", func(o *Options) { o.Upstream.ServerPort = 8090 }, "--server-port must be 0"},
		{"tcp without certs", func(o *Options) { o.Upstream.UdsName = ""; o.Upstream.ServerPort = 8090 }, "--server-ca-cert"},
		{"agent port reserved", func(o *Options) { o.Upstream.AgentPort = 80 }, "--agent-port"},
		{"health port ephemeral", func(o *Options) { o.Upstream.HealthPort = 50000 }, "--health-port"},
		{"admin port not a port", func(o *Options) { o.Upstream.AdminPort = 70000 }, "--admin-port"},
		{"token auth partial", func(o *Options) { o.Upstream.ClusterCaCert, o.Upstream.AgentNamespace = "", "kube-system" }, "--agent-service-account is required"},
		{"token auth", tokenAuth, ""},
		{"no agent authentication", func(o *Options) { o.Upstream.ClusterCaCert = "" }, "agents must authenticate"},
		{"no agent authentication, allowed", func(o *Options) { o.Upstream.ClusterCaCert, o.AllowUnauthenticatedAgents = "", true }, ""},
		{"agent auth timeout", func(o *Options) { o.AgentAuthTimeout = 0 }, "--agent-auth-timeout"},
		{"unauthenticated bound", func(o *Options) { o.MaxUnauthenticated = -1 }, "--max-unauthenticated-agent-connections must"},
		{"unauthenticated bound per source", func(o *Options) { o.MaxUnauthenticatedPerSource = -1 }, "--max-unauthenticated-agent-connections-per-source"},
		{"concurrent reviews", func(o *Options) { tokenAuth(o); o.MaxConcurrentTokenReviews = 0 }, "--max-concurrent-token-reviews"},
		{"review cache", func(o *Options) { tokenAuth(o); o.TokenReviewCacheTTL = -time.Second }, "--token-review-cache-ttl"},
		{"token auth with ca", func(o *Options) {
			o.Upstream.AgentNamespace, o.Upstream.AgentServiceAccount, o.Upstream.AuthenticationAudience = "a", "b", "c"
			o.Upstream.ClusterCaCert = file
		}, "--cluster-ca-cert"},
		{"strategy", func(o *Options) { o.Upstream.ProxyStrategies = "nearest" }, "--proxy-strategies"},
		{"xfr", func(o *Options) { o.Upstream.XfrChannelSize = 0 }, "--xfr-channel-size"},
		{"tls version", func(o *Options) { o.Upstream.TLSMinVersion = "TLS9" }, "--tls-min-version"},
		{"cipher", func(o *Options) { o.Upstream.CipherSuites = []string{"TLS_RSA_WITH_RC4_128_SHA"} }, "--cipher-suites"},
		{"contention", func(o *Options) { o.Upstream.EnableContentionProfiling = true }, "--enable-profiling"},
		{"graceful", func(o *Options) { o.GracefulTimeout = -1 }, "--graceful-timeout"},
		{"server id", func(o *Options) { o.Upstream.ServerID = "" }, "--server-id cannot be empty"},
		{"server count", func(o *Options) { o.Upstream.ServerCount = -1 }, "--server-count must not be negative"},
		{"server count 0, as upstream's agents take it", func(o *Options) { o.Upstream.ServerCount = 0 }, ""},
		{"agent bind address", func(o *Options) { o.Upstream.AgentBindAddress = "999.1.1.1" }, "--agent-bind-address"},
		{"empty allowed name", func(o *Options) { o.ClusterAllowedNames = []string{"", ""} }, "--cluster-allowed-names"},
		{"keepalive", func(o *Options) { o.Upstream.KeepaliveTime = -time.Second }, "--keepalive-time"},
		{"frontend keepalive", func(o *Options) { o.Upstream.FrontendKeepaliveTime = -time.Second }, "--frontend-keepalive-time"},
		{"lease namespace", func(o *Options) {
			o.Upstream.EnableLeaseController, o.Upstream.KubeconfigPath, o.Upstream.LeaseNamespace = true, file, ""
		}, "--lease-namespace"},
		{"buffer", func(o *Options) { o.ConnectionBuffer = 10 }, "--frontend-buffer-bytes"},
		{"max message", func(o *Options) { o.MaxFrontendMessage = 1024 }, "--max-frontend-message-bytes"},
		{"kubeconfig absent", func(o *Options) { o.Upstream.KubeconfigPath = filepath.Join(dir, "kc") }, "--kubeconfig"},
		// Outside a pod, with no in-cluster config to fall back on as upstream does.
		{"lease controller", func(o *Options) { o.Upstream.EnableLeaseController = true }, "--kubeconfig is required when --enable-lease-controller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			valid(o)
			tc.mut(o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want error naming %q, got %v", tc.want, err)
			}
		})
	}
}

// socketOptions are valid options of a server on the socket /x.sock, with file as every certificate.
func socketOptions(t *testing.T) (o *Options, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	o = NewOptions()
	o.Upstream.UdsName, o.Upstream.ServerPort = "/x.sock", 0
	o.Upstream.ClusterCert, o.Upstream.ClusterKey, o.Upstream.ClusterCaCert = file, file, file
	return o, file
}

func TestConfigGracefulTimeout(t *testing.T) {
	o, file := socketOptions(t)
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tunnel.GracefulTimeout != tunnel.DefaultGracefulTimeout || cfg.Tunnel.ServerAddr != "" || cfg.Tunnel.AgentAddr != ":8091" {
		t.Fatalf("config %+v", cfg)
	}
	o.Upstream.GracefulShutdownTimeout = 3e9
	if cfg, _ = o.Config(); cfg.Tunnel.GracefulTimeout != 3e9 {
		t.Fatalf("--graceful-shutdown-timeout not honoured: %v", cfg.Tunnel.GracefulTimeout)
	}
	// An explicit 0 is upstream's "no graceful shutdown", not "unset".
	o = NewOptions()
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--uds-name=/x.sock", "--server-port=0", "--cluster-cert=" + file, "--cluster-key=" + file, "--cluster-ca-cert=" + file, "--graceful-shutdown-timeout=0"}); err != nil {
		t.Fatal(err)
	}
	if cfg, err = o.Config(); err != nil || cfg.Tunnel.GracefulTimeout != 0 {
		t.Fatalf("--graceful-shutdown-timeout=0: %v, %v", cfg.Tunnel.GracefulTimeout, err)
	}
}

// TestDefaultsThatDifferFromUpstream: besides --backend-dial-timeout (TestFlagsMatchUpstream), the two
// defaults the help and README.md name: -v is 0, and an empty --health-bind-address binds 127.0.0.1.
func TestDefaultsThatDifferFromUpstream(t *testing.T) {
	o, _ := socketOptions(t)
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	o.AddFlags(fs)
	daemon.AddKlogFlags(fs, "v")
	if v := fs.Lookup("v"); v == nil || v.DefValue != "0" {
		t.Errorf("-v default: %v, want 0", v)
	}
	if f := fs.Lookup("health-bind-address"); f == nil || f.DefValue != "" {
		t.Fatalf("--health-bind-address default: %v, want upstream's empty one", f)
	}
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(cfg.HealthAddr); host != "127.0.0.1" {
		t.Fatalf("empty --health-bind-address binds %q, want 127.0.0.1", cfg.HealthAddr)
	}
}

// TestConfigServerCountZero: --server-count=0, which upstream's server starts with and its agents count as
// one server, reaches the tunnel as 1.
func TestConfigServerCountZero(t *testing.T) {
	o, _ := socketOptions(t)
	o.Upstream.ServerCount = 0
	if cfg, err := o.Config(); err != nil || cfg.Tunnel.ServerCount != 1 {
		t.Fatalf("--server-count=0: %+v, %v; want a server count of 1", cfg, err)
	}
}

// TestConfigWarnsOfOpenKeys: a key that others than its owner may read is logged at start with konnect
// init's words and the flag, and the server still starts; a key of mode 0600 is not.
func TestConfigWarnsOfOpenKeys(t *testing.T) {
	dir := t.TempDir()
	key := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	closed, open, groupOpen := key("closed.key", 0o600), key("open.key", 0o644), key("group.key", 0o640)
	for _, tc := range []struct {
		name string
		mut  func(o *Options)
		want string // "" for no warning
	}{
		{"cluster key 0600", func(o *Options) { o.Upstream.ClusterKey = closed }, ""},
		{"cluster key 0644", func(o *Options) { o.Upstream.ClusterKey = open },
			"--cluster-key: WARNING: the key is mode 0644, readable by others: chmod 600 " + open},
		{"server key 0640", func(o *Options) {
			o.Upstream.UdsName, o.Upstream.ServerPort = "", 8090
			o.Upstream.ServerCert, o.Upstream.ServerCaCert = closed, closed
			o.Upstream.ServerKey = groupOpen
		}, "--server-key: WARNING: the key is mode 0640, readable by others: chmod 600 " + groupOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := harness.CaptureKlog(t)
			o, _ := socketOptions(t)
			tc.mut(o)
			if _, err := o.Config(); err != nil {
				t.Fatalf("a warning, not an error: %v", err)
			}
			got := logs()
			switch {
			case tc.want == "" && strings.Contains(got, "WARNING"):
				t.Errorf("unexpected warning: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("log %q, want %q in it", got, tc.want)
			}
		})
	}
}

// TestQueueFlagAliases: the server takes the agent's names for the per-connection queue and its stall bound,
// and still takes its first names.
func TestQueueFlagAliases(t *testing.T) {
	for _, args := range [][]string{
		{"--connection-buffer-bytes=1048576", "--connection-stall-timeout=3s"},
		{"--frontend-buffer-bytes=1048576", "--stalled-reader-timeout=3s"},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if o.ConnectionBuffer != 1<<20 || o.StallTimeout != 3*time.Second {
			t.Errorf("%v: buffer %d, stall %v", args, o.ConnectionBuffer, o.StallTimeout)
		}
	}
}

// TestFlowControlReachesConfig: the flow-control flags reach the tunnel's Config.
func TestFlowControlReachesConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args        []string
		off         bool
		window, max int
	}{
		{nil, false, 64 << 10, 4 << 20},
		{[]string{"--flow-control-window-bytes=32768", "--flow-control-max-window-bytes=1048576"}, false, 32 << 10, 1 << 20},
		{[]string{"--flow-control=false"}, true, 64 << 10, 4 << 20},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
		o.AddFlags(fs)
		args := append([]string{"--uds-name=/x.sock", "--server-port=0", "--cluster-cert=" + file, "--cluster-key=" + file,
			"--cluster-ca-cert=" + file}, tc.args...)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := o.Config()
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c := cfg.Tunnel; c.DisableFlowControl != tc.off || c.FlowWindow != tc.window || c.FlowMaxWindow != tc.max {
			t.Errorf("%v: flow control off %v, window %d, max %d", tc.args, c.DisableFlowControl, c.FlowWindow, c.FlowMaxWindow)
		}
	}
}

// TestDialLimitsReachConfig: the pending-dial timeout and bound are on by default, 0 turns either off as
// upstream has it, and a negative bound is refused naming the flag.
func TestDialLimitsReachConfig(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		timeout time.Duration
		max     int
		err     string
	}{
		{nil, tunnel.DefaultBackendDialTimeout, tunnel.DefaultMaxPendingDials, ""},
		{[]string{"--backend-dial-timeout=0", "--max-pending-dials=0"}, 0, 0, ""},
		{[]string{"--backend-dial-timeout=5s", "--max-pending-dials=10"}, 5 * time.Second, 10, ""},
		{[]string{"--max-pending-dials=-1"}, 0, 0, "--max-pending-dials"},
		{[]string{"--backend-dial-timeout=-1s"}, 0, 0, "--backend-dial-timeout"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "f")
			if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			o := NewOptions()
			fs := pflag.NewFlagSet("konnect", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			o.Upstream.UdsName, o.Upstream.ServerPort = filepath.Join(dir, "s.sock"), 0
			o.Upstream.ClusterCert, o.Upstream.ClusterKey, o.Upstream.ClusterCaCert = file, file, file
			err := o.Validate()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Validate: %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := o.Config()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Tunnel.BackendDialTimeout != tc.timeout || cfg.Tunnel.MaxPendingDials != tc.max {
				t.Fatalf("BackendDialTimeout %v, MaxPendingDials %d; want %v, %d", cfg.Tunnel.BackendDialTimeout, cfg.Tunnel.MaxPendingDials, tc.timeout, tc.max)
			}
		})
	}
}
