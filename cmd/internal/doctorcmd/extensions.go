package doctorcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/konnect-dev/konnect/egress/extensions"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// errChecksFailed makes the command exit 1 after printing its report, without cobra printing an error.
type errChecksFailed struct{ failed int }

func (e errChecksFailed) Error() string {
	return fmt.Sprintf("%d extension server(s) failed their check", e.failed)
}

func newExtensionsCommand() *cobra.Command {
	var (
		kubeconfig string
		front      tunnel.Frontend
		output     string
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "extensions",
		Short: "Check every aggregated API server and webhook the way kube-apiserver reaches it, and name why one is not reachable",
		Long: `Lists every APIService served by a Service, every validating and mutating webhook, and every CRD conversion
webhook, and checks each the way kube-apiserver reaches it: the Service, its ready endpoints, a dial, and the
TLS handshake verified against that object's caBundle and the Service's DNS name (NAME.NS.svc), with a
warning when the serving certificate expires within 30 days.

The dial goes through the Konnectivity socket when --uds-name is given (on a control-plane node), and
otherwise through kube-apiserver's pods/portforward to the endpoint's pod (from anywhere kubectl works, a
laptop with konnect socks included); kube-apiserver reaches the pod's kubelet through the same tunnel.

A failure is named: service not found, no endpoints, no agent available, connection refused, dial timeout,
unknown authority (the caBundle does not match), name mismatch, expired. Webhooks called by URL go through
the egress selector's controlplane context, not the tunnel, and are listed as skipped.

The exit code is 0 when every check passes and 1 when any fails; warnings do not change it.`,
		Example: `  konnect doctor extensions
  konnect doctor extensions --uds-name /etc/kubernetes/konnectivity-server/konnectivity-server.socket -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o/--output must be table or json, not %q", output)
			}
			if front.Mode != "grpc" && front.Mode != "http-connect" {
				return fmt.Errorf("--mode must be grpc or http-connect, not %q", front.Mode)
			}
			if err := positiveTimeout(timeout); err != nil {
				return err
			}
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
			if err != nil {
				return fmt.Errorf("--kubeconfig: %w", err)
			}
			cfg.Timeout = timeout
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("--kubeconfig: %w", err)
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("--kubeconfig: %w", err)
			}
			var dialer extensions.Dialer = extensions.PortForwardDialer{Config: cfg, Kube: kube}
			if front.UDSName != "" {
				dialer = extensions.TunnelDialer{Frontend: front}
			}
			ctx := cmd.Context()
			targets, err := extensions.Discover(ctx, kube, dyn)
			if err != nil {
				return err
			}
			checker := &extensions.Checker{Kube: kube, Dialer: dialer, Timeout: timeout}
			results := make([]extensions.Result, 0, len(targets))
			failed := 0
			for _, t := range targets {
				r := withRemedy(checker.Check(ctx, t))
				if !r.OK {
					failed++
				}
				results = append(results, r)
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				if err := printExtensionsJSON(w, results); err != nil {
					return err
				}
			} else {
				printExtensions(w, results, dialer.Via(), time.Now())
			}
			if failed > 0 {
				cmd.SilenceErrors = true
				return errChecksFailed{failed}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fl.StringVar(&front.UDSName, "uds-name", "", "dial through this Konnectivity server socket, as kube-apiserver does (on a control-plane node)")
	fl.StringVar(&front.Mode, "mode", "grpc", "the socket's protocol: grpc or http-connect (the server's --mode)")
	fl.StringVarP(&output, "output", "o", "table", "output format: table or json")
	fl.DurationVar(&timeout, "timeout", 10*time.Second, "bound on each API request, dial and handshake (kube-apiserver's webhook default is 10s)")
	return cmd
}

// withRemedy adds doctor's advice to a result's detail where the library's cause has one: for an endpoint
// that pods/portforward cannot reach, the tunnel, which reaches any endpoint, from where its socket is.
func withRemedy(r extensions.Result) extensions.Result {
	if r.Cause == extensions.CauseNotPod {
		r.Detail += ": run konnect doctor extensions on a control-plane node with --uds-name"
	}
	return r
}

func printExtensionsJSON(w io.Writer, results []extensions.Result) error {
	b, err := json.MarshalIndent(struct {
		Extensions []extensions.Result `json:"extensions"`
	}{results}, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func printExtensions(w io.Writer, results []extensions.Result, via string, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSERVICE\tRESULT\tLATENCY\tEXPIRES")
	var notes []string
	for _, r := range results {
		result, latency, expires := "OK", "-", "-"
		switch {
		case r.Skipped:
			result = "skipped (URL)"
		case !r.OK:
			result = r.Cause
			notes = append(notes, fmt.Sprintf("%s %s: %s", r.Kind, r.Name, r.Detail))
		}
		if r.LatencyMs > 0 {
			latency = (time.Duration(r.LatencyMs*1000) * time.Microsecond).Round(100 * time.Microsecond).String()
		}
		if r.NotAfter != nil {
			expires = r.NotAfter.UTC().Format("2006-01-02")
			if r.NotAfter.Before(now) {
				expires += " (expired)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Kind, r.Name, r.Service, result, latency, expires)
		for _, warn := range r.Warnings {
			notes = append(notes, fmt.Sprintf("warning: %s %s: %s", r.Kind, r.Name, warn))
		}
	}
	tw.Flush()
	if len(results) == 0 {
		fmt.Fprintln(w, "no APIService served by a Service, no webhook and no CRD conversion webhook found")
	}
	fmt.Fprintf(w, "\nchecked through %s\n", via)
	if len(notes) > 0 {
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
}
