package initcmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/spf13/cobra"
)

// NewCertsCommand returns `konnect certs`.
func NewCertsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Check, renew and issue aggregation-layer and Konnectivity certificates",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCheckExpirationCommand(), newRenewCommand(), newAPIServiceCommand(), newWebhookCommand(), newRotateCACommand())
	nameFields(cmd)
	return cmd
}

// absDir makes the directory given to flag absolute; errors name the flag.
func absDir(flag, dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%s must not be empty", flag)
	}
	if err := checkPath(flag, dir); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", flag, dir, err)
	}
	return abs, nil
}

func newCheckExpirationCommand() *cobra.Command {
	dir, output := pki.DefaultDir, "text"
	cmd := &cobra.Command{
		Use:   "check-expiration",
		Short: "List the certificates in DIR/pki and DIR/" + pki.KubeconfigFile + " with their expiry",
		Long: `List every certificate konnect knows of that exists in DIR/pki, and the client certificate embedded in
DIR/` + pki.KubeconfigFile + `: name, file, expiry, residual time, whether it is a CA, and whether it is
externally managed (its CA's key is not on this node, so konnect cannot renew it). No key material is
printed.

Given a directory written by konnect certs apiservice or konnect certs webhook (its --out), it lists the
extension server's certificates: apiservice-ca, apiservice-ca-next during a CA rotation, and
apiservice-serving (DIR/pki/tls.crt), under the names konnect certs renew takes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: must be text or json", output)
			}
			d, err := absDir("--dir", dir)
			if err != nil {
				return err
			}
			// An unreadable certificate is a row with its error: the others are listed all the same, and
			// the command still fails, naming every unreadable file.
			exp, readErr := pki.CheckExpiration(pki.Config{Dir: d})
			if readErr != nil && len(exp) == 0 {
				return readErr
			}
			// The same failure in either format: a script reading JSON must not take an empty or mistyped
			// --dir for one whose certificates are all fine. Nothing is printed then, not even empty JSON.
			if len(exp) == 0 {
				return fmt.Errorf("--dir %s: no certificates found in %s", d, filepath.Join(d, pki.PKISubdir))
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				b, err := json.MarshalIndent(struct {
					Certificates []pki.Expiration `json:"certificates"`
				}{exp}, "", "  ")
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintln(w, string(b)); err != nil {
					return err
				}
				return readErr
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CERTIFICATE\tEXPIRES\tRESIDUAL TIME\tCA\tEXTERNALLY MANAGED\tFILE")
			for _, e := range exp {
				if e.Error != "" {
					fmt.Fprintf(tw, "%s\tunreadable: %s\t\t\t\t%s\n", e.Name, e.Error, e.File)
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.NotAfter.Format("Jan 02, 2006 15:04 MST"), e.Residual, yesNo(e.CA), yesNo(e.External), e.File)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return readErr
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "konnect directory (certificates in DIR/pki)")
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: text or json")
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newRenewCommand() *cobra.Command {
	dir := pki.DefaultDir
	caValidity, certValidity := pki.DefaultCAValidity, pki.DefaultCertValidity
	dryRun := false
	var valid []string
	var lines, servingLines []string
	for _, s := range pki.Specs() {
		valid = append(valid, s.Name)
		lines = append(lines, fmt.Sprintf("  %-28s %s", s.Name, s.Description))
	}
	for _, s := range pki.ServingSpecs("NAME", "NS", pki.ServingFromNext) {
		valid = append(valid, s.Name)
		servingLines = append(servingLines, fmt.Sprintf("  %-28s %s", s.Name, s.Description))
	}
	cmd := &cobra.Command{
		Use:   "renew NAME|all...",
		Short: "Re-sign certificates with their CA, keeping keys and SANs",
		Long: `Re-sign certificates in DIR/pki with their CA. Each keeps its key (and so its key algorithm), its
SANs and its subject; only the validity changes. "all" renews every leaf present; a CA is renewed only when
named, and is re-signed with its own key so that everything it issued stays valid. Renewing
konnectivity-server-client or ca also updates DIR/` + pki.KubeconfigFile + `, which embeds both; after
renewing ca, run konnect init again and re-apply DIR/` + manifests.AgentBundleDir + `, whose
ConfigMap carries ca.crt to the agents, and with --transport tcp restart kube-apiserver, which reads
its egress caBundle only when it starts. When a renewed file is one that the server's static pod
DIR/` + ManifestsSubdir + `/` + manifests.ServerPodFile + ` mounts, renew sets the pod's annotation ` + manifests.FilesDigestAnnotation + ` to the
digest of the files it mounts now, and changes nothing else in it: kubelet restarts the server, which then
uses the renewed files. With several control-plane nodes, renew one node at a time. Each renewal prints
the steps it needs. To replace a key, delete the certificate's files and run konnect init.

Certificates:
  all                          every leaf certificate present in DIR/pki
` + strings.Join(lines, "\n") + `

In a directory written by konnect certs apiservice or konnect certs webhook (--dir is its --out, with
DIR/pki/tls.crt), the certificates are the extension server's, and DIR/` + manifests.ServingSecretFile + ` and the
caBundles of the manifests DIR/kustomization.yaml lists are updated to match:
` + strings.Join(servingLines, "\n"),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("name the certificates to renew, or all:\n  %-28s %s\n%s\nin a directory written by konnect certs apiservice or konnect certs webhook:\n%s",
					pki.All, "every leaf certificate present in DIR/pki", strings.Join(lines, "\n"), strings.Join(servingLines, "\n"))
			}
			return nil
		},
		ValidArgs: append([]string{pki.All}, valid...),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := absDir("--dir", dir)
			if err != nil {
				return err
			}
			if err := validities(caValidity, certValidity, minValidity); err != nil {
				return err
			}
			if !dryRun {
				release, err := lockDir(cmd.ErrOrStderr(), "--dir", d, false)
				if err != nil {
					return err
				}
				defer release()
			}
			cfg := pki.Config{Dir: d, CAValidity: caValidity, CertValidity: certValidity, DryRun: dryRun}
			serving := pki.IsServingDir(cfg.PKIDir())
			res, err := pki.Renew(cfg, args...)
			present := func(name string) bool {
				s, ok := pki.Lookup(pki.Specs(), name)
				if !ok {
					return false
				}
				_, err := os.Stat(s.CertFile(cfg.PKIDir()))
				return err == nil
			}
			var next []string
			renewed := false
			for _, r := range res {
				verb := string(r.Action)
				if r.DryRun {
					verb = "would be " + verb
				}
				note := ""
				if r.Reason != "" {
					note = ": " + r.Reason
				}
				fmt.Fprintf(cmd.OutOrStdout(), "[%s] %s (expires %s)%s\n", verb, r.CertFile, r.NotAfter.UTC().Format(time.RFC3339), note)
				for _, step := range renewalSteps(r.Name, present) {
					if !r.DryRun && r.Action == pki.Renewed && !slices.Contains(next, step) {
						next = append(next, step)
					}
				}
				renewed = renewed || (r.Action == pki.Renewed && !r.DryRun)
			}
			if serving && renewed && err == nil {
				step, rerr := refreshServing(cmd.OutOrStdout(), d)
				next = append(next, step)
				err = rerr
			}
			if !serving {
				// Also after an error: what was renewed is on disk, and the server should start with it.
				line, pod, perr := refreshServerPod(d, res)
				if line != "" {
					fmt.Fprintln(cmd.OutOrStdout(), line)
				}
				if pod != podUnknown {
					next = slices.DeleteFunc(next, func(s string) bool { return strings.HasPrefix(s, restartServerStep) })
				}
				if pod == podUpdated {
					next = append([]string{serverRestartsStep}, next...)
				}
				err = errors.Join(err, perr)
			}
			for _, step := range next {
				fmt.Fprintf(cmd.OutOrStdout(), "next: %s\n", strings.ReplaceAll(step, "DIR", d))
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "konnect directory (certificates in DIR/pki)")
	cmd.Flags().DurationVar(&caValidity, "ca-validity-period", caValidity, "lifetime of a renewed CA certificate (at least "+minValidity.String()+")")
	cmd.Flags().DurationVar(&certValidity, "cert-validity-period", certValidity, "lifetime of renewed leaf certificates (at least "+minValidity.String()+")")
	cmd.Flags().BoolVar(&dryRun, "dry-run", dryRun, "print what would be renewed, and write nothing")
	return cmd
}

// refreshServing brings the Secret and the caBundles of the extension server's directory d in line with
// its renewed certificates, as rotate-ca does, and returns the next step: apply them. A directory without
// the kustomization.yaml that lists the manifests is left as it is, and the next step is to write them again.
func refreshServing(w io.Writer, d string) (next string, err error) {
	rerun := "run konnect certs apiservice or konnect certs webhook again with --out DIR, as when DIR was written: DIR/" +
		manifests.ServingSecretFile + " and the caBundles still carry the certificates from before the renewal"
	if _, err := os.Stat(filepath.Join(d, "kustomization.yaml")); err != nil {
		return rerun, nil
	}
	ref, err := servingRef(d)
	if err != nil {
		return rerun, fmt.Errorf("--dir %s: certificates renewed, but the manifests were not updated: %w", d, err)
	}
	bundle, err := pki.ReadServingBundle(filepath.Join(d, pki.PKISubdir))
	if err != nil {
		return rerun, fmt.Errorf("--dir %s: certificates renewed, but the manifests were not updated: %w", d, err)
	}
	r := &runner{o: &Options{}, out: w}
	err = rewriteServing(r, d, ref, bundle)
	r.print()
	if err != nil {
		return rerun, fmt.Errorf("--dir %s: certificates renewed, but the manifests were not updated: %w", d, err)
	}
	return "apply DIR again (kubectl apply -k DIR): its Secret and caBundles now carry the renewed certificates", nil
}

// restartServerStep starts the step for a renewed file of the server's when renew could not update its static
// pod (refreshServerPod): there is none in DIR/manifests, or it is not konnect's.
const restartServerStep = "restart the konnectivity-server static pod, or run konnect init again, whose new manifest kubelet restarts it for: "

// serverRestartsStep replaces restartServerStep once renew has updated the server's static pod. Each
// control-plane node has its own server certificates and pod; one node at a time leaves the agents the
// servers of the others while one restarts.
const serverRestartsStep = "kubelet restarts the konnectivity-server static pod with the renewed files (its annotation " + manifests.FilesDigestAnnotation +
	" changed): wait until " + manifests.Namespace + "/konnectivity-server-NODE is Ready again; with several control-plane nodes, renew one node at a time, each once the server before it is Ready"

// serverPod is what refreshServerPod found.
type serverPod int

const (
	podUnknown    serverPod = iota // none in DIR/manifests, or not konnect's: restartServerStep stays
	podUnaffected                  // konnect's, and it mounts no renewed file: no restart needed
	podUpdated                     // its annotation changed, and kubelet restarts it
)

// refreshServerPod brings the server's static pod DIR/manifests/konnectivity-server.yaml in line with a
// renewal: when a file it mounts was renewed (res), it sets the pod's manifests.FilesDigestAnnotation to the
// digest of the files it mounts now, and kubelet restarts the server, whose file mounts would otherwise keep
// the old files. Only that annotation's value changes (manifests.SetFilesDigest): renew has none of init's
// flags to render the pod from, and whatever an operator changed in the pod stays. The file keeps its mode,
// and is replaced atomically, never through a path that another user could redirect. A pod that mounts no
// renewed file is not touched, and neither is one that is not konnect's (no manifests.ManagedByLabel). line
// is what to print, if anything.
func refreshServerPod(d string, res []pki.Result) (line string, found serverPod, err error) {
	path := filepath.Join(d, ManifestsSubdir, manifests.ServerPodFile)
	fail := func(err error) (string, serverPod, error) {
		return "", podUnknown, fmt.Errorf("%s: certificates renewed, but the server's static pod was not updated, so it still runs the old ones (restart it yourself): %w", path, err)
	}
	resolved, err := safepath.Resolve(path)
	if err != nil {
		if _, serr := os.Lstat(path); os.IsNotExist(serr) {
			return "", podUnknown, nil
		}
		return fail(err)
	}
	data, err := smallfile.Read(resolved)
	if os.IsNotExist(err) {
		return "", podUnknown, nil
	}
	if err != nil {
		return fail(err)
	}
	konnects := manifests.ManagedByKonnect(data, path)
	pod, err := kubeapiserver.DecodePod(data, path)
	if err != nil && !konnects {
		return "", podUnknown, nil
	}
	if err != nil {
		return fail(err)
	}
	files := manifests.PodMountedFiles(pod)
	dryRun, mounted := false, false
	for _, r := range res {
		if (r.Action == pki.Renewed || r.Action == pki.Updated) && slices.ContainsFunc(files, func(f string) bool { return sameFile(f, r.CertFile) }) {
			mounted, dryRun = true, r.DryRun
		}
	}
	switch {
	case !konnects && mounted:
		return fmt.Sprintf("[kept] %s: it mounts renewed files, but konnect did not write it (no label %s=%s), so only a restart brings them to the server", path, manifests.ManagedByLabel, manifests.ManagedBy), podUnknown, nil
	case !konnects:
		return "", podUnknown, nil
	case !mounted:
		return "", podUnaffected, nil
	}
	what := "annotation " + manifests.FilesDigestAnnotation + " follows the renewed files it mounts: kubelet restarts the Konnectivity server with them"
	if dryRun {
		return fmt.Sprintf("[would be updated] %s: %s", path, what), podUnknown, nil
	}
	digest, err := manifests.FilesDigest(files)
	if err != nil {
		return fail(err)
	}
	out, changed, err := manifests.SetFilesDigest(data, path, digest)
	if err != nil {
		return fail(err)
	}
	if !changed {
		return fmt.Sprintf("[kept] %s: its annotation %s already matches the files it mounts", path, manifests.FilesDigestAnnotation), podUnaffected, nil
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return fail(err)
	}
	// What a killed renewal left: hidden, so kubelet ignores it, but gone before the new write, as init does.
	pki.RemoveStaleTemps(resolved)
	if _, err := pki.WriteFile(resolved, out, st.Mode().Perm(), pki.DirMode); err != nil {
		return fail(err)
	}
	return fmt.Sprintf("[updated] %s: %s", path, what), podUpdated, nil
}

// sameFile reports whether paths a and b name one file: the same path, or links to it.
func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// renewalSteps are what must happen before the renewed certificate called name is used: a step for each of
// its readers that does not read it again by itself. present reports whether a certificate of DIR/pki
// exists, which shows the set-up a reader depends on (pki.Feed's With).
func renewalSteps(name string, present func(name string) bool) []string {
	s, ok := pki.Lookup(pki.Specs(), name)
	if !ok {
		return nil
	}
	var steps []string
	for _, f := range s.Feeds {
		switch {
		case f.Restart == "":
		case f.With != "" && !present(f.With):
		case f.Reader == pki.ServerPod:
			steps = append(steps, restartServerStep+f.Restart)
		case f.Reader == pki.AgentBundle:
			steps = append(steps, "run konnect init again and re-apply DIR/"+manifests.AgentBundleDir+": "+f.Restart)
		default:
			steps = append(steps, "restart kube-apiserver: "+f.Restart)
		}
	}
	return steps
}

// minValidity is the shortest --ca-validity-period and --cert-validity-period accepted. Every later run
// checks the certificates and refuses an expired one, and a new one is backdated by 5 minutes for clock
// skew: a lifetime of minutes (1ns gave notAfter = now) makes certificates that the next run, or the next
// restart of what reads them, finds expired.
const minValidity = time.Hour

// validities checks the lifetimes of new certificates. minCert is the shortest leaf lifetime accepted:
// minValidity, except for the serving certificate of certs apiservice and certs webhook with
// --allow-short-validity, which may be issued to expire at once (--cert-validity-period 1s) to see how
// kube-apiserver and konnect doctor take an expired one; the next run there refuses it until --force renews
// it. A zero or negative lifetime is refused whatever minCert is.
func validities(ca, cert, minCert time.Duration) error {
	if ca < minValidity {
		return fmt.Errorf("--ca-validity-period %s: must be at least %s", ca, minValidity)
	}
	if cert <= 0 {
		return fmt.Errorf("--cert-validity-period %s: must be positive", cert)
	}
	if cert < minCert {
		return fmt.Errorf("--cert-validity-period %s: must be at least %s", cert, minCert)
	}
	if cert > ca {
		return fmt.Errorf("--cert-validity-period %s: exceeds --ca-validity-period %s", cert, ca)
	}
	return nil
}
