// Package kubeconfigcmd is `konnect kubeconfig set-proxy`: it sets the proxy-url of a kubeconfig's cluster,
// keeping the rest of the file as it is, under kubectl's lock.
package kubeconfigcmd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/clientcmd"
)

// SetProxyOptions are the flags of `konnect kubeconfig set-proxy`.
type SetProxyOptions struct {
	Kubeconfig string
	Context    string
	ProxyURL   string
	// Remove removes the proxy-url instead of setting one: an empty ProxyURL is refused, so that an unset
	// shell variable never drops the proxy.
	Remove bool
}

// checkProxyURL accepts what client-go accepts in a cluster's proxy-url: http, https and socks5. An empty
// URL is refused: --remove removes the setting.
func checkProxyURL(s string) error {
	if s == "" {
		return errors.New("--proxy-url: empty; to remove the cluster's proxy-url, pass --remove instead")
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

// Run sets (or with Remove, clears) proxy-url on the cluster of the context, after saving a backup of the
// file next to it (pki.Backup: .NAME.konnect-backup-TIME, never replacing an earlier run's). Only that line
// of the file changes. It holds kubectl's lock on the file from reading it to writing it, waiting for
// kubectl or another run to finish (said on errOut), and writes nothing where another user could redirect
// it. It reports what it did to out.
func (o *SetProxyOptions) Run(out, errOut io.Writer) error {
	if o.Context == "" {
		return errors.New("--context: required")
	}
	switch {
	case o.Remove && o.ProxyURL != "":
		return errors.New("--remove and --proxy-url: give one of them, not both")
	case !o.Remove:
		if err := checkProxyURL(o.ProxyURL); err != nil {
			return err
		}
	}
	path, err := o.kubeconfigPath()
	if err != nil {
		return err
	}
	// Write through a symlink (a kubeconfig kept with one's dotfiles), as kubectl does, instead of replacing
	// the link with a file; but only a link, and to a file, that no other user could change.
	file, err := safepath.Resolve(path)
	if errors.Is(err, safepath.ErrShared) {
		return fmt.Errorf("--kubeconfig: refusing to write %s: %w", path, err)
	}
	if err != nil {
		return fmt.Errorf("--kubeconfig: %s: %w", path, err)
	}
	st, err := os.Stat(file)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	release, err := lockKubeconfig([]string{path, file}, kubeconfigLockWait, func(lock, holder string) {
		fmt.Fprintf(errOut, "Waiting for %s, which holds %s (at most %s)...\n", holder, lock, kubeconfigLockWait)
	})
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	defer release()
	orig, err := smallfile.Read(file)
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
	if cluster.ProxyURL == "" && o.Remove {
		fmt.Fprintf(out, "cluster %q (context %q) has no proxy-url; %s unchanged\n", kctx.Cluster, o.Context, path)
		return nil
	}
	if cluster.ProxyURL == o.ProxyURL {
		fmt.Fprintf(out, "cluster %q (context %q) already has proxy-url %q; %s unchanged\n", kctx.Cluster, o.Context, redactedURL(o.ProxyURL), path)
		return nil
	}
	data, err := setProxyURL(orig, kctx.Cluster, o.ProxyURL)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %s: %w", path, err)
	}
	mode := st.Mode().Perm()
	backup, err := pki.Backup(file, "", orig, mode, time.Now())
	if err != nil {
		return err
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
		Use:   "set-proxy --context NAME (--proxy-url URL | --remove)",
		Short: "Set or remove proxy-url on the cluster of a kubeconfig context (keeps a backup)",
		Long: `set-proxy sets proxy-url on the cluster entry that the context uses, so that kubectl and every
client-go program reach that API server through the proxy, e.g. konnect socks. client-go accepts http,
https and socks5 URLs (not socks5h: with socks5 the proxy already resolves names). --remove, instead of
--proxy-url, removes the setting; an empty --proxy-url is refused, so that an unset shell variable never
drops the proxy. Only that line of the file changes: its order and comments stay. The previous file is
kept beside it as .NAME.konnect-backup-TIME (UTC), and no run replaces an earlier run's backup.
While it reads and writes the file it holds PATH.lock, the lock kubectl takes, so that it never loses a
change that kubectl config or another run makes at the same time; it waits for another holder. A symlink
is written through only when no other user could change it or what it leads to.`,
		Example: `  konnect kubeconfig set-proxy --context prod --proxy-url socks5://127.0.0.1:1080
  konnect kubeconfig set-proxy --context prod --remove`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch changed := cmd.Flags().Changed("proxy-url"); {
			case changed && o.Remove:
				return errors.New("--remove and --proxy-url: give one of them, not both")
			case !changed && !o.Remove:
				return errors.New("--proxy-url: required (or --remove, to remove the setting)")
			}
			return o.Run(cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	set.Flags().StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file to edit. Default: the first file in $KUBECONFIG, else ~/.kube/config.")
	set.Flags().StringVar(&o.Context, "context", o.Context, "Context whose cluster gets the proxy-url.")
	set.Flags().StringVar(&o.ProxyURL, "proxy-url", o.ProxyURL, "Proxy URL: socks5://host:port, http://host:port or https://host:port.")
	set.Flags().BoolVar(&o.Remove, "remove", o.Remove, "Remove the cluster's proxy-url instead of setting one.")
	cmd.AddCommand(set)
	return cmd
}

// setProxyURL returns data, a kubeconfig, with proxy-url set to proxyURL (removed when empty) on the cluster
// entry named cluster. It edits that one line of the text, so that the file's order, comments and layout stay
// as they were; only a cluster entry in flow style ({server: ...}) is written anew from the YAML node tree,
// which keeps order and comments but not every detail of layout. Either way the result must load as the
// original with only that proxy-url changed, or nothing is written.
func setProxyURL(data []byte, cluster, proxyURL string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	m, err := clusterEntry(&doc, cluster)
	if err != nil {
		return nil, err
	}
	want, err := clientcmd.Load(data)
	if err != nil {
		return nil, err
	}
	want.Clusters[cluster].ProxyURL = proxyURL
	check := func(out []byte) bool {
		got, err := clientcmd.Load(out)
		return err == nil && apiequality.Semantic.DeepEqual(got, want)
	}
	if out, ok := editProxyURLLine(data, m, proxyURL); ok && check(out) {
		return out, nil
	}
	setKey(m, "proxy-url", proxyURL)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	if !check(buf.Bytes()) {
		return nil, fmt.Errorf("cannot set proxy-url on cluster %q without changing other settings; the file is left as it was", cluster)
	}
	return buf.Bytes(), nil
}

// clusterEntry finds the mapping under clusters[name=cluster].cluster.
func clusterEntry(doc *yaml.Node, cluster string) (*yaml.Node, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a kubeconfig: no mapping at the top")
	}
	clusters := mapValue(doc.Content[0], "clusters")
	if clusters == nil || clusters.Kind != yaml.SequenceNode {
		return nil, errors.New("no list of clusters")
	}
	var found *yaml.Node
	for _, item := range clusters.Content {
		if item.Kind != yaml.MappingNode {
			continue
		}
		if n := mapValue(item, "name"); n != nil && n.Value == cluster {
			if found != nil {
				return nil, fmt.Errorf("cluster %q is listed twice", cluster)
			}
			found = mapValue(item, "cluster")
			if found == nil || found.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("cluster %q has no cluster settings", cluster)
			}
		}
	}
	if found == nil {
		return nil, fmt.Errorf("cluster %q not found", cluster)
	}
	return found, nil
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// setKey sets key to a string value in the mapping m, or removes it when value is empty.
func setKey(m *yaml.Node, key, value string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			if value == "" {
				m.Content = append(m.Content[:i], m.Content[i+2:]...)
			} else {
				m.Content[i+1] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
			}
			return
		}
	}
	if value != "" {
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
	}
}

// editProxyURLLine sets proxy-url in the block mapping m by editing one line of data: the line of an existing
// proxy-url is replaced (or removed), or a new one goes right before server, where kubectl, which sorts the
// keys, would put it. ok is false where the layout does not allow such an edit.
func editProxyURLLine(data []byte, m *yaml.Node, proxyURL string) (out []byte, ok bool) {
	if m.Style&yaml.FlowStyle != 0 || len(m.Content) == 0 {
		return nil, false
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	// line returns the 0-based index of the line key k starts on, if k is alone on it up to its column.
	line := func(k *yaml.Node) (int, bool) {
		i := k.Line - 1
		if i < 0 || i >= len(lines) || k.Column < 1 || k.Column > len(lines[i]) {
			return 0, false
		}
		return i, len(bytes.TrimLeft(lines[i][:k.Column-1], " ")) == 0
	}
	value, err := yaml.Marshal(proxyURL)
	if err != nil || bytes.Count(value, []byte("\n")) != 1 {
		return nil, false
	}
	newLine := func(k *yaml.Node, i int) []byte {
		eol := []byte("\n")
		if bytes.HasSuffix(lines[i], []byte("\r\n")) {
			eol = []byte("\r\n")
		}
		return append(append([]byte(strings.Repeat(" ", k.Column-1)+"proxy-url: "), bytes.TrimSuffix(value, []byte("\n"))...), eol...)
	}
	var anchor *yaml.Node
	for j := 0; j+1 < len(m.Content); j += 2 {
		k, v := m.Content[j], m.Content[j+1]
		if k.Value == "proxy-url" {
			i, ok := line(k)
			if !ok || v.Line != k.Line || v.Kind != yaml.ScalarNode || v.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
				return nil, false
			}
			if proxyURL == "" {
				return slices.Concat(slices.Concat(lines[:i]...), slices.Concat(lines[i+1:]...)), true
			}
			return slices.Concat(slices.Concat(lines[:i]...), newLine(k, i), slices.Concat(lines[i+1:]...)), true
		}
		if anchor == nil && k.Value == "server" {
			anchor = k
		}
	}
	if proxyURL == "" {
		return data, true
	}
	if anchor == nil {
		anchor = m.Content[0]
	}
	i, ok := line(anchor)
	if !ok {
		return nil, false
	}
	return slices.Concat(slices.Concat(lines[:i]...), newLine(anchor, i), slices.Concat(lines[i:]...)), true
}
