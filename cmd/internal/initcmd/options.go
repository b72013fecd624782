package initcmd

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/address"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/konnect-dev/konnect/pki/uds"
	"github.com/spf13/pflag"
)

// Agent authentication methods (--agent-auth).
const (
	AgentAuthToken = "token"
	AgentAuthMTLS  = "mtls"
)

// Output files relative to --dir besides the pki and the kubeconfig; the e2e harness and the manifests
// rely on these names.
const (
	EgressConfigFile = "egress-selector-configuration.yaml"
	FlagsFile        = "kube-apiserver.flags"
	ManifestsSubdir  = "manifests"
)

// Options are the flags of konnect init and its phases.
type Options struct {
	// Where everything goes.
	Dir string

	// Certificates.
	ControlPlaneAddresses []string
	KeyAlgorithm          string
	CAValidity            time.Duration
	CertValidity          time.Duration

	// The Konnectivity server's kubeconfig.
	APIServerURL string

	// How kube-apiserver reaches the Konnectivity server, and how agents authenticate.
	Mode      kubeapiserver.Mode
	Transport kubeapiserver.Transport
	UDSName   string
	// AllowSharedUDSDir accepts a socket directory that another user could change, and passes the server's
	// flag of that name into its static pod.
	AllowSharedUDSDir bool
	FrontendPort      int
	AgentAuth         string
	// ServerLeases: servers keep Leases that agents count (upstream's lease flags).
	ServerLeases bool

	// Manifests.
	Image string

	// kube-apiserver.
	EnableAggregatorRouting bool
	APIServerManifest       string
	// Kubeadm records konnect's kube-apiserver changes in kubeadm's ClusterConfiguration, through
	// KubeadmKubeconfig.
	Kubeadm           bool
	KubeadmKubeconfig string

	// Behaviour.
	Force  bool
	DryRun bool

	// set names the flags given on the command line (Complete), so that one that does not apply to the
	// others is refused rather than ignored.
	set map[string]bool
	// manifestByKubeadm: APIServerManifest is kubeadm's default, which --kubeadm chose (Complete).
	manifestByKubeadm bool
}

// manifestFlag is the flag that named APIServerManifest, for its errors: --apiserver-manifest, or --kubeadm
// when that chose kubeadm's manifest.
func (o *Options) manifestFlag() string {
	if o.manifestByKubeadm {
		return "--kubeadm"
	}
	return "--apiserver-manifest"
}

// NewOptions spells out every default.
func NewOptions() *Options {
	return &Options{
		Dir:          pki.DefaultDir,
		KeyAlgorithm: string(pki.RSA2048),
		CAValidity:   pki.DefaultCAValidity,
		CertValidity: pki.DefaultCertValidity,
		Mode:         kubeapiserver.ModeGRPC,
		Transport:    kubeapiserver.TransportUDS,
		UDSName:      kubeapiserver.DefaultUDSName,
		FrontendPort: kubeapiserver.DefaultFrontendPort,
		AgentAuth:    AgentAuthToken,
		Image:        defaultImage(),

		KubeadmKubeconfig: DefaultKubeadmKubeconfig,
	}
}

// AddFlags registers every option with its current value as the default.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Dir, "dir", o.Dir, "directory to write into: DIR/pki, DIR/"+pki.KubeconfigFile+", DIR/"+EgressConfigFile+", DIR/"+FlagsFile+", DIR/"+ManifestsSubdir+", DIR/"+manifests.AgentBundleDir)
	fs.StringArrayVar(&o.ControlPlaneAddresses, "control-plane-address", o.ControlPlaneAddresses, "IP address or DNS name under which agents reach this control plane (repeatable); SAN of konnectivity-server.crt")
	fs.StringVar(&o.KeyAlgorithm, "key-algorithm", o.KeyAlgorithm, "algorithm of new keys: "+joinAlgorithms())
	fs.DurationVar(&o.CAValidity, "ca-validity-period", o.CAValidity, "lifetime of new CA certificates (at least "+minValidity.String()+")")
	fs.DurationVar(&o.CertValidity, "cert-validity-period", o.CertValidity, "lifetime of new leaf certificates (at least "+minValidity.String()+")")
	fs.StringVar(&o.APIServerURL, "apiserver-url", o.APIServerURL, "https URL of kube-apiserver, written into "+pki.KubeconfigFile)
	fs.Var(modeValue{&o.Mode}, "mode", "protocol between kube-apiserver and the Konnectivity server: grpc or http-connect")
	fs.Var(transportValue{&o.Transport}, "transport", "transport between kube-apiserver and the Konnectivity server: uds or tcp (tcp needs --mode http-connect)")
	fs.StringVar(&o.UDSName, "uds-name", o.UDSName, "unix socket of the Konnectivity server (--transport uds); with a non-default --dir, defaults to DIR/konnectivity-server/konnectivity-server.socket")
	fs.BoolVar(&o.AllowSharedUDSDir, "allow-shared-uds-dir", o.AllowSharedUDSDir, "accept a --uds-name directory, or one above it, that another user could change (everyone may write to it without the sticky bit, or it belongs to another user), and run the Konnectivity server with --allow-shared-uds-dir; whoever can write there could replace the socket")
	fs.IntVar(&o.FrontendPort, "frontend-port", o.FrontendPort, "TCP port of the Konnectivity server's kube-apiserver frontend on 127.0.0.1 (--transport tcp)")
	fs.StringVar(&o.AgentAuth, "agent-auth", o.AgentAuth, "how agents authenticate to the Konnectivity server: token (projected service-account token) or mtls (client certificate)")
	fs.BoolVar(&o.ServerLeases, "server-leases", o.ServerLeases, "servers keep a Lease each in the namespace "+manifests.LeaseNamespace+" and agents count them (upstream's --enable-lease-controller and --count-server-leases), for a number of servers that changes; agents watch the Leases at --apiserver-url, which every node must reach, and the manifests add the Roles on Leases")
	fs.StringVar(&o.Image, "image", o.Image, "container image of the Konnectivity server static pod and agent DaemonSet; the default is the image that make image builds (bin/konnect-image.tar) for this binary's version")
	// kube-apiserver's --api-audiences is no longer touched; a script that still passes this keeps working.
	fs.StringSlice("api-audiences", nil, "")
	_ = fs.MarkDeprecated("api-audiences", "it is ignored: kube-apiserver checks the agents' tokens against the audience the server's TokenReviews name, and listing that audience in --api-audiences would make the tokens credentials for its API")
	fs.BoolVar(&o.EnableAggregatorRouting, "enable-aggregator-routing", o.EnableAggregatorRouting, "add --enable-aggregator-routing=true (no kube-proxy on the control-plane node)")
	fs.StringVar(&o.APIServerManifest, "apiserver-manifest", o.APIServerManifest, "also patch this kube-apiserver static pod manifest (e.g. "+kubeapiserver.DefaultAPIServerManifest+"), keeping a backup")
	fs.BoolVar(&o.Kubeadm, "kubeadm", o.Kubeadm, "the control plane is kubeadm's: patch "+kubeapiserver.DefaultAPIServerManifest+" (unless --apiserver-manifest names another) and record the change in kubeadm's ClusterConfiguration (ConfigMap "+kubeapiserver.KubeadmConfigNamespace+"/"+kubeapiserver.KubeadmConfigName+"), so that kubeadm upgrade and kubeadm join --control-plane keep it")
	fs.StringVar(&o.KubeadmKubeconfig, "kubeadm-kubeconfig", o.KubeadmKubeconfig, "kubeconfig with which --kubeadm updates the ConfigMap "+kubeapiserver.KubeadmConfigName)
	fs.BoolVar(&o.Force, "force", o.Force, "renew leaf certificates that fail their checks, rewrite a kubeconfig that points elsewhere, and replace files konnect did not write, keeping a backup beside each (never a CA)")
	fs.BoolVar(&o.DryRun, "dry-run", o.DryRun, "print what would be written, and write nothing")
}

func joinAlgorithms() string {
	var s []string
	for _, a := range pki.KeyAlgorithms() {
		s = append(s, string(a))
	}
	return strings.Join(s, ", ")
}

// needs says which inputs a run requires.
type needs struct {
	addresses    bool
	apiserverURL bool
	manifests    bool // the manifests phase runs: its inputs are checked before any phase writes
}

// Complete fills defaults that depend on other flags.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	if o.Dir != "" {
		abs, err := filepath.Abs(o.Dir)
		if err != nil {
			return fmt.Errorf("--dir %q: %w", o.Dir, err)
		}
		o.Dir = abs
	}
	if o.Kubeadm && o.APIServerManifest == "" {
		o.APIServerManifest = kubeapiserver.DefaultAPIServerManifest
		o.manifestByKubeadm = true
	}
	o.set = map[string]bool{}
	if fs != nil {
		fs.Visit(func(f *pflag.Flag) { o.set[f.Name] = true })
	}
	if !o.set["uds-name"] && filepath.Clean(o.Dir) != pki.DefaultDir {
		// The socket sits where it would under the default directory, so that one --dir moves everything.
		o.UDSName = filepath.Join(o.Dir, strings.TrimPrefix(kubeapiserver.DefaultUDSName, pki.DefaultDir))
	}
	return nil
}

// inapplicable refuses flags given for a set-up the others do not make: they would be ignored, and the
// user would take the files for ones that follow them.
func (o *Options) inapplicable() []error {
	var errs []error
	if o.set["frontend-port"] && o.Transport != kubeapiserver.TransportTCP {
		errs = append(errs, fmt.Errorf("--frontend-port applies only with --transport tcp (the transport is %s)", o.Transport))
	}
	if o.set["uds-name"] && o.Transport == kubeapiserver.TransportTCP {
		errs = append(errs, errors.New("--uds-name applies only with --transport uds (the transport is tcp)"))
	}
	if o.set["kubeadm-kubeconfig"] && !o.Kubeadm {
		errs = append(errs, errors.New("--kubeadm-kubeconfig applies only with --kubeadm"))
	}
	return errs
}

// Validate names the flag in every error.
func (o *Options) Validate(n needs) error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("--dir must not be empty"))
	}
	if err := checkPath("--dir", o.Dir); err != nil {
		errs = append(errs, err)
	}
	if o.set["uds-name"] {
		if err := checkPath("--uds-name", o.UDSName); err != nil {
			errs = append(errs, err)
		}
	}
	if n.addresses && len(o.ControlPlaneAddresses) == 0 {
		errs = append(errs, errors.New("--control-plane-address is required: it becomes a SAN of konnectivity-server.crt"))
	}
	for _, a := range o.ControlPlaneAddresses {
		if err := address.Validate(a); err != nil {
			errs = append(errs, fmt.Errorf("--control-plane-address: %w", err))
		} else if err := address.CheckDialable(a); err != nil {
			// The first address becomes the agents' --proxy-server-host; each is a SAN they check.
			errs = append(errs, fmt.Errorf("--control-plane-address: %w; give an address at which agents reach this control plane", err))
		}
	}
	if _, err := pki.ParseKeyAlgorithm(o.KeyAlgorithm); err != nil {
		errs = append(errs, fmt.Errorf("--key-algorithm: %w", err))
	}
	if err := validities(o.CAValidity, o.CertValidity, minValidity); err != nil {
		errs = append(errs, err)
	}
	if n.apiserverURL && o.APIServerURL == "" {
		errs = append(errs, errors.New("--apiserver-url is required: it is the server of "+pki.KubeconfigFile))
	}
	if o.APIServerURL != "" {
		if err := pki.ValidateAPIServerURL(o.APIServerURL); err != nil {
			errs = append(errs, fmt.Errorf("--apiserver-url: %w", err))
		}
	}
	if o.ServerLeases && n.manifests {
		if o.APIServerURL == "" {
			errs = append(errs, errors.New("--server-leases needs --apiserver-url: agents watch the Leases there"))
		} else if err := manifests.CheckAgentAPIServerURL(o.APIServerURL); err != nil {
			errs = append(errs, fmt.Errorf("--apiserver-url (with --server-leases): %w", err))
		}
	}
	if o.AgentAuth != AgentAuthToken && o.AgentAuth != AgentAuthMTLS {
		errs = append(errs, fmt.Errorf("--agent-auth %q: must be %s or %s", o.AgentAuth, AgentAuthToken, AgentAuthMTLS))
	}
	errs = append(errs, o.inapplicable()...)
	if o.FrontendPort < 1 || o.FrontendPort > 65535 {
		errs = append(errs, fmt.Errorf("--frontend-port %d: must be 1-65535", o.FrontendPort))
	}
	if err := o.selector().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--mode/--transport/--uds-name: %w", err))
	}
	if o.Transport != kubeapiserver.TransportTCP && o.UDSName != "" && o.Dir != "" {
		if err := o.checkSocketDir(); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Dir != "" {
		errs = append(errs, o.checkOutputs()...)
	}
	if o.Kubeadm && o.KubeadmKubeconfig == "" {
		errs = append(errs, errors.New("--kubeadm-kubeconfig must not be empty with --kubeadm"))
	}
	if o.APIServerManifest != "" {
		flag := o.manifestFlag()
		if _, err := safepath.Resolve(o.APIServerManifest); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: refusing to patch it: %w", flag, o.APIServerManifest, err))
		}
		// Decoded here, and its kube-apiserver container found, before anything is written, so that a
		// manifest that konnect cannot patch leaves no PKI behind.
		if data, err := smallfile.Read(o.APIServerManifest); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		} else if pod, err := kubeapiserver.DecodePod(data, o.APIServerManifest); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		} else if err := kubeapiserver.CheckPod(pod); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", flag, o.APIServerManifest, err))
		}
	}
	if n.manifests && len(errs) == 0 {
		errs = append(errs, o.validateServerManifest())
	}
	return fieldFlags.Error(errors.Join(errs...))
}

// checkPath refuses a path with a control character (a line break, a tab, ...) in it. No one names a file
// so on purpose, and konnect writes the paths it is given into files that hold one entry a line
// (kube-apiserver.flags) and into its reports, one file a line, which a line break would split.
func checkPath(flag, path string) error {
	if i := strings.IndexFunc(path, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%s %q: a path must not contain a control character (%U)", flag, path, []rune(path[i:])[0])
	}
	return nil
}

// checkSocketDir refuses a socket directory that holds anything but the socket: the server's pod, which runs
// as root, mounts the socket's directory read-write (kube-apiserver read-only), so a shared one (/run with
// the container runtime's socket, or konnect's own keys and static pods) would be its to change.
func (o *Options) checkSocketDir() error {
	sock, err := filepath.Abs(o.UDSName)
	if err != nil {
		return fmt.Errorf("--uds-name: %w", err)
	}
	dir := filepath.Dir(sock)
	refuse := func(what string) error {
		return fmt.Errorf("--uds-name %s: its directory %s holds %s, and the Konnectivity server's pod mounts it read-write; put the socket in a directory of its own (default %s)",
			o.UDSName, dir, what, filepath.Dir(filepath.Join(o.Dir, strings.TrimPrefix(kubeapiserver.DefaultUDSName, pki.DefaultDir))))
	}
	for _, held := range []string{o.Dir, o.pkiDir(), filepath.Join(o.Dir, ManifestsSubdir), filepath.Join(o.Dir, manifests.AgentBundleDir)} {
		if rel, err := filepath.Rel(dir, held); err == nil && !strings.HasPrefix(rel, "..") {
			return refuse(held)
		}
	}
	// The server makes the same check when it binds, and without its --allow-shared-uds-dir would not start.
	if !o.AllowSharedUDSDir {
		if err := uds.CheckDir(dir); errors.Is(err, uds.ErrSharedDir) {
			return fmt.Errorf("--uds-name %s: %w; put the socket in a directory of its own, or pass --allow-shared-uds-dir (which the server's pod then gets too) if only kube-apiserver and the server can write there", o.UDSName, err)
		} else if err != nil {
			return fmt.Errorf("--uds-name %s: %w", o.UDSName, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--uds-name %s: %w", o.UDSName, err)
	}
	var others []string
	for _, e := range entries {
		if e.Name() != filepath.Base(sock) {
			others = append(others, e.Name())
		}
	}
	switch {
	case len(others) > 3:
		return refuse(strings.Join(others[:3], ", ") + fmt.Sprintf(" and %d more", len(others)-3))
	case len(others) > 0:
		return refuse(strings.Join(others, ", "))
	}
	return nil
}

// checkOutputs refuses, before anything is written, what another user could redirect: --dir, a directory in
// it that init writes into, or one above them, that they own or may write to; or a file init writes that is a
// symlink it must not write through (see safepath.Resolve). pki refuses these too, and pki.WriteFile, but
// only when their turn comes, after earlier phases wrote. There is no flag to accept a shared --dir: whoever
// can change the CA certificates there is trusted by kube-apiserver.
func (o *Options) checkOutputs() []error {
	dirErr := func(err error) error {
		if errors.Is(err, safepath.ErrShared) {
			return fmt.Errorf("--dir %s: %w; konnect writes keys there: make it root's (or yours) and closed to others (chown, chmod go-w)", o.Dir, err)
		}
		return fmt.Errorf("--dir %s: %w", o.Dir, err)
	}
	if err := safepath.CheckDir(o.Dir); err != nil {
		return []error{dirErr(err)}
	}
	var errs []error
	for _, d := range []string{o.pkiDir(), filepath.Join(o.Dir, ManifestsSubdir), filepath.Join(o.Dir, manifests.AgentBundleDir)} {
		if err := safepath.CheckDir(d); err != nil {
			errs = append(errs, dirErr(err))
			break // one is enough: they share --dir
		}
	}
	if len(errs) > 0 {
		return errs
	}
	for _, f := range o.outputFiles() {
		if _, err := safepath.Resolve(f); err != nil {
			errs = append(errs, fmt.Errorf("--dir %s: refusing to write %s: %w", o.Dir, f, err))
		}
	}
	return errs
}

// outputFiles are the files init may write under --dir.
func (o *Options) outputFiles() []string {
	var files []string
	for _, s := range pki.Specs() {
		files = append(files, s.CertFile(o.pkiDir()), s.KeyFile(o.pkiDir()))
	}
	files = append(files,
		filepath.Join(o.Dir, pki.KubeconfigFile), filepath.Join(o.Dir, EgressConfigFile), filepath.Join(o.Dir, FlagsFile),
		filepath.Join(o.Dir, ManifestsSubdir, manifests.ServerPodFile), filepath.Join(o.Dir, manifests.AgentBundleDir, "kustomization.yaml"))
	for _, f := range manifests.AgentBundleFiles {
		files = append(files, filepath.Join(o.Dir, manifests.AgentBundleDir, f))
	}
	return files
}

// validateServerManifest checks the server's static pod before any phase writes: a bad --image found only by
// the manifests phase would come after kube-apiserver was patched to dial a server that was never set up.
func (o *Options) validateServerManifest() error {
	if err := manifests.CheckImage(o.Image); err != nil {
		return fmt.Errorf("--image: %w", err)
	}
	if o.Transport == kubeapiserver.TransportTCP {
		for _, p := range []struct {
			what string
			port int
		}{{"agent", manifests.DefaultAgentPort}, {"admin", manifests.DefaultAdminPort}, {"health", manifests.DefaultHealthPort}} {
			if o.FrontendPort == p.port {
				return fmt.Errorf("--frontend-port %d is the Konnectivity server's %s port; pick another", o.FrontendPort, p.what)
			}
		}
	}
	if err := o.serverManifest().Validate(); err != nil {
		return fmt.Errorf("the Konnectivity server's static pod: %w", err)
	}
	return nil
}

// PKI is the certificate configuration.
func (o *Options) PKI() pki.Config {
	hostname, _ := os.Hostname()
	return pki.Config{
		Dir:                   o.Dir,
		ControlPlaneAddresses: o.ControlPlaneAddresses,
		Hostname:              strings.ToLower(hostname),
		KeyAlgorithm:          pki.KeyAlgorithm(o.KeyAlgorithm),
		CAValidity:            o.CAValidity,
		CertValidity:          o.CertValidity,
		AgentMTLS:             o.AgentAuth == AgentAuthMTLS,
		FrontendTLS:           o.Transport == kubeapiserver.TransportTCP,
		Force:                 o.Force,
		DryRun:                o.DryRun,
	}
}

// pkiDir is DIR/pki, where the certs phase writes.
func (o *Options) pkiDir() string { return (&pki.Config{Dir: o.Dir}).PKIDir() }

// selector is kube-apiserver's egress configuration.
func (o *Options) selector() kubeapiserver.SelectorConfig {
	c := kubeapiserver.SelectorConfig{Mode: o.Mode, Transport: o.Transport}
	if o.Transport == kubeapiserver.TransportTCP {
		pkiDir := o.pkiDir()
		specs := pki.Specs()
		ca, _ := pki.Lookup(specs, pki.CA)
		client, _ := pki.Lookup(specs, pki.APIServerEgressClient)
		// kube-apiserver and the Konnectivity server share the node; konnectivity-frontend.crt covers 127.0.0.1.
		c.URL = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(o.FrontendPort))
		c.CABundle = ca.CertFile(pkiDir)
		c.ClientCert = client.CertFile(pkiDir)
		c.ClientKey = client.KeyFile(pkiDir)
		return c
	}
	c.UDSName = o.UDSName
	return c
}

// apiserverFlags are the kube-apiserver flags.
func (o *Options) apiserverFlags() kubeapiserver.APIServerFlags {
	pkiDir := o.pkiDir()
	specs := pki.Specs()
	fpca, _ := pki.Lookup(specs, pki.FrontProxyCA)
	fpc, _ := pki.Lookup(specs, pki.FrontProxyClient)
	return kubeapiserver.APIServerFlags{
		RequestHeaderClientCAFile: fpca.CertFile(pkiDir),
		ProxyClientCertFile:       fpc.CertFile(pkiDir),
		ProxyClientKeyFile:        fpc.KeyFile(pkiDir),
		EgressSelectorConfigFile:  filepath.Join(o.Dir, EgressConfigFile),
		EnableAggregatorRouting:   o.EnableAggregatorRouting,
	}
}
