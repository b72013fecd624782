package initcmd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

func newWebhookCommand() *cobra.Command {
	o := newServingOptions()
	cmd := &cobra.Command{
		Use:   "webhook --service NAME --namespace NS [--out DIR] [MANIFEST...]",
		Short: "Issue a webhook's serving CA and certificate, and set the caBundle in its manifests",
		Long: `Issue what an admission or CRD conversion webhook behind a Service needs, into --out (default
./NAME-webhook), and set its caBundle in the manifests given as arguments:

  OUT/pki/ca.{crt,key}     serving CA; its certificate is the caBundle
  OUT/pki/tls.{crt,key}    serving certificate, CN NAME.NS.svc, SANs NAME.NS.svc and NAME.NS.svc.cluster.local
  OUT/secret.yaml          kubernetes.io/tls Secret NAME-tls in NS (tls.crt, tls.key, ca.crt)
  OUT/MANIFEST             a copy of each MANIFEST with the caBundle set
  OUT/kustomization.yaml   so that "kubectl apply -k OUT" applies them

The caBundle is set on every webhook of a ValidatingWebhookConfiguration or MutatingWebhookConfiguration
whose clientConfig.service is NAME in NS, and on spec.conversion.webhook.clientConfig of a
CustomResourceDefinition whose service is NAME in NS; an existing caBundle there is replaced. Webhooks that
point elsewhere or by URL, and every other object, are left as they were. Existing certificates are checked
and kept, so a second run changes no byte; konnect certs rotate-ca replaces the CA without a failed request.`,
		Example: "  konnect certs webhook --service pizza-webhook --namespace pizza --out ./pizza-webhook webhook.yaml crd.yaml",
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWebhook(cmd.OutOrStdout(), cmd.ErrOrStderr(), &o, args)
		},
	}
	o.addFlags(cmd.Flags(), "webhook server", "webhook")
	return cmd
}

func runWebhook(w, stderr io.Writer, o *servingOptions, manifestFiles []string) error {
	if err := errors.Join(o.validate()...); err != nil {
		return err
	}
	out, err := o.outDir("webhook")
	if err != nil {
		return err
	}
	release, err := o.lock(stderr, out)
	if err != nil {
		return err
	}
	defer release()
	// Every input is read and checked before any certificate is written.
	ref := manifests.ServiceRef{Name: o.service, Namespace: o.namespace}
	inputs := map[string][]byte{}
	var names []string
	matches := 0
	for _, f := range manifestFiles {
		data, err := smallfile.Read(f)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		base := filepath.Base(f)
		if slices.Contains(manifests.APIServiceFiles, base) {
			// certs apiservice writes these into a directory it may share with certs webhook: a copy under
			// one of their names would replace the APIService's file, or be replaced by it.
			return fmt.Errorf("manifest %s: its name collides with %s, which konnect writes into --out (certs apiservice: %s); rename it",
				f, filepath.Join(out, base), strings.Join(manifests.APIServiceFiles, ", "))
		}
		if _, dup := inputs[base]; dup {
			return fmt.Errorf("manifest %s: another argument has the same file name %s, and both would be written to %s", f, base, filepath.Join(out, base))
		}
		_, found, err := manifests.SetCABundle(data, ref, nil)
		if err != nil {
			return fmt.Errorf("manifest %s: %w", f, err)
		}
		matches += len(found)
		inputs[base] = data
		names = append(names, base)
	}
	if len(names) > 0 && matches == 0 {
		return fmt.Errorf("no webhook configuration or CustomResourceDefinition in %s reaches its server through Service %s: nothing to set the caBundle on",
			strings.Join(manifestFiles, ", "), ref)
	}
	// Someone else's kustomization.yaml is refused before any certificate is written.
	if _, err := servingKustomization(out, nil); err != nil {
		return err
	}
	r := &runner{o: &Options{DryRun: o.dryRun, Force: o.force}, out: w}
	defer r.print()
	bundle, err := o.ensure(r, out)
	if err != nil {
		return err
	}
	if bundle.Cert == nil { // dry run on a fresh directory
		r.outcomes = append(r.outcomes, outcome{action: pki.Created, dryRun: true, file: filepath.Join(out, "(Secret, manifests, kustomization.yaml)")})
		return nil
	}
	secret, err := manifests.RenderServingSecret(ref, manifests.ServingCerts{CA: bundle.CA, Cert: bundle.Cert, Key: bundle.Key})
	if err != nil {
		return err
	}
	var copies []manifests.File
	var patched []manifests.Patched
	for _, base := range names {
		data, p, err := manifests.SetCABundle(inputs[base], ref, bundle.CA)
		if err != nil {
			return fmt.Errorf("manifest %s: %w", base, err)
		}
		patched = append(patched, p...)
		copies = append(copies, manifests.File{Name: base, Data: markedCopy(data), Mode: 0o644})
	}
	k, err := servingKustomization(out, append([]manifests.File{secret}, copies...))
	if err != nil {
		return err
	}
	if err := r.writeFiles(out, []manifests.File{secret}); err != nil {
		return err
	}
	for _, c := range copies {
		// An earlier copy of the same manifest, with any caBundle (an older konnect's has no mark), or the
		// manifest itself when --out holds it: replacing it loses nothing.
		earlier := func(old []byte) bool {
			data, _, err := manifests.SetCABundle(old, ref, bundle.CA)
			return err == nil && bytes.Equal(markedCopy(data), c.Data)
		}
		if err := r.replace(filepath.Join(out, c.Name), c.Data, c.Mode, earlier); err != nil {
			return err
		}
	}
	if err := r.writeFiles(out, []manifests.File{k}); err != nil {
		return err
	}
	for _, p := range patched {
		r.outcomes = append(r.outcomes, outcome{action: "caBundle set", file: p.String()})
	}
	return nil
}

// markedCopy is a webhook's manifest as certs webhook copies it into --out: marked as konnect's, unless it is
// JSON, which has no comments.
func markedCopy(data []byte) []byte {
	if t := bytes.TrimSpace(data); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return data
	}
	return marked(data, webhookCopy)
}

// webhookCopy is what the mark of a manifest that certs webhook copied says it is.
const webhookCopy = "certs webhook, a copy of a manifest given to it with the caBundle set"

// isWebhookCopy reports whether data is a manifest that certs webhook copied into its --out.
func isWebhookCopy(data []byte) bool { return bytes.HasPrefix(data, marked(nil, webhookCopy)) }

func newRotateCACommand() *cobra.Command {
	var out string
	var step int
	dryRun := false
	cmd := &cobra.Command{
		Use:   "rotate-ca --out DIR --step 1|2|3",
		Short: "Replace an extension server's serving CA in three steps, without a failed request",
		Long: `Replace the serving CA in a directory written by konnect certs apiservice or konnect certs webhook.
Apply each step ("kubectl apply -k DIR") and let it take effect before you write the next one:

  --step 1   a new CA (DIR/pki/ca-next.{crt,key}); every caBundle holds the old and the new CA
  --step 2   a serving certificate (and key) from the new CA in the Secret; servers pick it up when they
             reload their certificate files
  --step 3   every caBundle holds the new CA alone; the new CA becomes DIR/pki/ca.{crt,key}, and the old
             one is kept in DIR/pki/retired

New keys have the algorithm of DIR/pki/ca.key, and the new CA and serving certificate the lifetimes of
the ones they replace. A step already done changes nothing; a step out of order is refused and writes
nothing.`,
		Example: "  konnect certs rotate-ca --out ./pizza-webhook --step 1 && kubectl apply -k ./pizza-webhook",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required: the directory written by konnect certs apiservice or konnect certs webhook")
			}
			if step < 1 || step > 3 {
				return fmt.Errorf("--step %d: must be 1, 2 or 3", step)
			}
			dir, err := absDir("--out", out)
			if err != nil {
				return err
			}
			if !dryRun {
				release, err := lockDir(cmd.ErrOrStderr(), "--out", dir, false)
				if err != nil {
					return err
				}
				defer release()
			}
			return runRotateCA(cmd.OutOrStdout(), dir, step, dryRun)
		},
	}
	cmd.Flags().StringVar(&out, "out", out, "directory written by konnect certs apiservice or konnect certs webhook (required)")
	cmd.Flags().IntVar(&step, "step", step, "rotation step to write: 1, 2 or 3 (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", dryRun, "print what would be written, and write nothing")
	return cmd
}

func runRotateCA(w io.Writer, dir string, step int, dryRun bool) error {
	ref, err := servingRef(dir)
	if err != nil {
		return err
	}
	r := &runner{o: &Options{DryRun: dryRun}, out: w}
	res, bundle, phase, err := pki.RotateServingCA(pki.Config{Dir: filepath.Join(dir, pki.PKISubdir), DryRun: dryRun}, ref.Name, ref.Namespace, step)
	for _, x := range res {
		r.add(x)
	}
	if err != nil {
		r.print()
		if errors.Is(err, pki.ErrRotationOrder) {
			return fmt.Errorf("--step %d: %w", step, err)
		}
		return renewInstead(err, dir)
	}
	if dryRun {
		r.print()
		return nil
	}
	if err := rewriteServing(r, dir, ref, bundle); err != nil {
		r.print()
		return err
	}
	r.print()
	if res == nil {
		fmt.Fprintf(w, "Step %d was already done (%s); nothing changed.\n", step, phase)
		if step == 3 {
			// The state after a finished rotation is the same whenever it finished.
			fmt.Fprintf(w, "That is the last rotation, now complete; to replace the CA again, start with --step 1.\n")
		}
	} else {
		fmt.Fprintf(w, "Step %d written.\n", step)
	}
	fmt.Fprintf(w, "Apply it: kubectl apply -k %s\n", dir)
	switch phase {
	case pki.BundleBoth:
		fmt.Fprintf(w, "Next, once kube-apiserver has the new caBundle: konnect certs rotate-ca --out %s --step 2\n", dir)
	case pki.ServingFromNext:
		fmt.Fprintf(w, "Next, once every replica serves the new certificate (kubelet refreshes Secret volumes within about a minute, then the server reloads its files): konnect certs rotate-ca --out %s --step 3\n", dir)
	default:
		fmt.Fprintln(w, "The caBundle is the new CA alone: the rotation is complete.")
	}
	return nil
}

// renewInstead names, in err of rotate-ca on dir, the command that renews a serving certificate that fails its
// checks: the library's advice is --force, which init and certs webhook take and rotate-ca does not.
func renewInstead(err error, dir string) error {
	text := fieldFlags.Error(err).Error()
	advice := "(run with " + fieldFlags["Force"] + " to renew it)"
	if !strings.Contains(text, advice) {
		return err
	}
	return &renamed{text: strings.ReplaceAll(text, advice, "(renew it with konnect certs renew "+pki.APIServiceServing+" --dir "+dir+", then run this step again)"), err: err}
}

// renamed is err with another text.
type renamed struct {
	text string
	err  error
}

func (e *renamed) Error() string { return e.text }
func (e *renamed) Unwrap() error { return e.err }

// servingRef reads the Service an extension server directory is for from the CN of its serving
// certificate, NAME.NS.svc.
func servingRef(dir string) (manifests.ServiceRef, error) {
	path := filepath.Join(dir, pki.PKISubdir, "tls.crt")
	data, err := smallfile.Read(path)
	if err != nil {
		return manifests.ServiceRef{}, fmt.Errorf("--out %s: not a directory written by konnect certs apiservice or konnect certs webhook: %w", dir, err)
	}
	cert, err := pki.ParseCertificatePEM(data)
	if errors.Is(err, pki.ErrNoCertificate) {
		return manifests.ServiceRef{}, fmt.Errorf("%s: no PEM certificate", path)
	}
	if err != nil {
		return manifests.ServiceRef{}, fmt.Errorf("%s: %w", path, err)
	}
	parts := strings.Split(cert.Subject.CommonName, ".")
	if len(parts) != 3 || parts[2] != "svc" {
		return manifests.ServiceRef{}, fmt.Errorf("%s: common name %q is not SERVICE.NAMESPACE.svc", path, cert.Subject.CommonName)
	}
	return manifests.ServiceRef{Name: parts[0], Namespace: parts[1]}, nil
}

// servingKustomization is the kustomization.yaml of the extension server's directory out: the resources that
// an earlier run's lists, then files (see manifests.Kustomization). With no files it checks that out holds no
// kustomization.yaml of someone else's.
func servingKustomization(out string, files []manifests.File) (manifests.File, error) {
	path := filepath.Join(out, "kustomization.yaml")
	existing, err := smallfile.Read(path)
	if err != nil && !os.IsNotExist(err) {
		return manifests.File{}, fmt.Errorf("--out: %w", err)
	}
	k, err := manifests.Kustomization(existing, files)
	if err != nil {
		return manifests.File{}, fmt.Errorf("--out: %s: %w", path, err)
	}
	return k, nil
}

// rewriteServing sets bundle as the caBundle in every manifest of dir and re-renders the Secret. The
// manifests are those kustomization.yaml lists: certs webhook keeps each input's own name, whatever its
// extension.
func rewriteServing(r *runner, dir string, ref manifests.ServiceRef, bundle pki.ServingBundle) error {
	secret, err := manifests.RenderServingSecret(ref, manifests.ServingCerts{CA: bundle.CA, Cert: bundle.Cert, Key: bundle.Key})
	if err != nil {
		return err
	}
	kpath := filepath.Join(dir, "kustomization.yaml")
	kdata, err := smallfile.Read(kpath)
	if err != nil {
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(kdata, &k); err != nil {
		return fmt.Errorf("%s: %w", kpath, err)
	}
	var edited []manifests.File
	for _, base := range k.Resources {
		if base == manifests.ServingSecretFile {
			continue
		}
		if base != filepath.Base(base) {
			return fmt.Errorf("%s: resource %q is not a file of %s", kpath, base, dir)
		}
		p := filepath.Join(dir, base)
		data, err := smallfile.Read(p)
		if err != nil {
			return fmt.Errorf("%s lists %s: %w", kpath, base, err)
		}
		patched, found, err := manifests.SetCABundle(data, ref, bundle.CA)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if len(found) > 0 {
			edited = append(edited, manifests.File{Name: base, Data: patched, Mode: 0o644})
		}
	}
	if err := r.writeFiles(dir, []manifests.File{secret}); err != nil {
		return err
	}
	for _, f := range edited {
		// Only its caBundle changes: the rest stays as it was, whoever wrote it.
		if err := r.replace(filepath.Join(dir, f.Name), f.Data, f.Mode, func([]byte) bool { return true }); err != nil {
			return err
		}
	}
	return nil
}
