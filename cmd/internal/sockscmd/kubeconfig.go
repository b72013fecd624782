package sockscmd

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
)

// SetProxyOptions are the flags of `konnect kubeconfig set-proxy`.
type SetProxyOptions struct {
	Kubeconfig string
	Context    string
	ProxyURL   string
}

// checkProxyURL accepts what client-go accepts in a cluster's proxy-url: http, https and socks5. An empty
// URL removes the setting.
func checkProxyURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Parse's error quotes the whole URL, and so a password in it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("--proxy-url: not a valid URL: %w", err)
	}
	switch u.Scheme {
	case "http", "https", "socks5":
	case "socks5h":
		return errors.New("--proxy-url: client-go does not accept socks5h; use socks5:// — with konnect socks (and ssh -D) " +
			"host names are resolved on the remote side anyway, because client-go's SOCKS5 dialer sends them unresolved")
	default:
		return fmt.Errorf("--proxy-url: scheme %q is not supported by client-go; use http, https or socks5", u.Scheme)
	}
	if u.Host == "" || u.Port() == "" {
		return fmt.Errorf("--proxy-url: %q needs a host and a port, e.g. socks5://127.0.0.1:1080", u.Redacted())
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("--proxy-url: %q: port %s is not from 1 to 65535", u.Redacted(), u.Port())
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--proxy-url: %q must not have a path, query or fragment", u.Redacted())
	}
	return nil
}

// redactedURL is a proxy URL fit to print: a password in it is replaced by "xxxxx".
func redactedURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return s
}

// kubeconfigPath is --kubeconfig, else the first file of $KUBECONFIG, else ~/.kube/config.
func (o *SetProxyOptions) kubeconfigPath() (string, error) {
	if o.Kubeconfig != "" {
		return o.Kubeconfig, nil
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		for _, p := range filepath.SplitList(env) {
			if p != "" {
				return p, nil
			}
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("--kubeconfig: no home directory: %w", err)
	}
	return filepath.Join(home, ".kube", "config"), nil
}

// Run sets (or clears) proxy-url on the cluster of the context, after saving a backup of the file next to it
// (PATH.konnect-backup). It reports what it did to out.
func (o *SetProxyOptions) Run(out io.Writer) error {
	if o.Context == "" {
		return errors.New("--context: required")
	}
	if err := checkProxyURL(o.ProxyURL); err != nil {
		return err
	}
	path, err := o.kubeconfigPath()
	if err != nil {
		return err
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	cfg, err := clientcmd.Load(orig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %s: %w", path, err)
	}
	kctx, ok := cfg.Contexts[o.Context]
	if !ok {
		var names []string
		for n := range cfg.Contexts {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("--context: context %q not found in %s (contexts: %s)", o.Context, path, strings.Join(names, ", "))
	}
	cluster, ok := cfg.Clusters[kctx.Cluster]
	if !ok {
		return fmt.Errorf("--context: context %q refers to cluster %q, which is not in %s", o.Context, kctx.Cluster, path)
	}
	if cluster.ProxyURL == o.ProxyURL {
		fmt.Fprintf(out, "cluster %q (context %q) already has proxy-url %q; %s unchanged\n", kctx.Cluster, o.Context, redactedURL(o.ProxyURL), path)
		return nil
	}
	cluster.ProxyURL = o.ProxyURL
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	// Write through a symlink (a kubeconfig kept with one's dotfiles), as kubectl does, instead of
	// replacing the link with a file.
	file, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	st, err := os.Stat(file)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	mode := st.Mode().Perm()
	backup := file + ".konnect-backup"
	// The directory exists (path was just read), so the directory mode is never used.
	if _, err := pki.WriteFile(backup, orig, mode, pki.DirMode); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := pki.WriteFile(file, data, mode, pki.DirMode); err != nil {
		return err
	}
	if o.ProxyURL == "" {
		fmt.Fprintf(out, "removed proxy-url from cluster %q (context %q) in %s; backup in %s\n", kctx.Cluster, o.Context, path, backup)
	} else {
		fmt.Fprintf(out, "set proxy-url %s on cluster %q (context %q) in %s; backup in %s\n", redactedURL(o.ProxyURL), kctx.Cluster, o.Context, path, backup)
	}
	return nil
}

// NewKubeconfigCommand returns `konnect kubeconfig` with its set-proxy subcommand.
func NewKubeconfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Edit a kubeconfig for access through konnect socks",
		Args:  cobra.NoArgs,
	}
	o := &SetProxyOptions{}
	set := &cobra.Command{
		Use:   "set-proxy --context NAME --proxy-url URL",
		Short: "Set proxy-url on the cluster of a kubeconfig context (keeps a backup)",
		Long: `set-proxy sets proxy-url on the cluster entry that the context uses, so that kubectl and every
client-go program reach that API server through the proxy, e.g. konnect socks. client-go accepts http,
https and socks5 URLs (not socks5h: with socks5 the proxy already resolves names). An empty --proxy-url
removes the setting. The previous file is kept as PATH.konnect-backup.`,
		Example: `  konnect kubeconfig set-proxy --context prod --proxy-url socks5://127.0.0.1:1080`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("proxy-url") {
				return errors.New("--proxy-url: required (an empty value removes the setting)")
			}
			return o.Run(cmd.OutOrStdout())
		},
	}
	set.Flags().StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file to edit. Default: the first file in $KUBECONFIG, else ~/.kube/config.")
	set.Flags().StringVar(&o.Context, "context", o.Context, "Context whose cluster gets the proxy-url.")
	set.Flags().StringVar(&o.ProxyURL, "proxy-url", o.ProxyURL, "Proxy URL: socks5://host:port, http://host:port or https://host:port.")
	cmd.AddCommand(set)
	return cmd
}
