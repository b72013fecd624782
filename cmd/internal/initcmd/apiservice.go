package initcmd

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/safepath"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// servingOptions are the flags every command that issues an extension server's serving certificate has.
type servingOptions struct {
	service, namespace       string
	out                      string
	keyAlgorithm             string
	caValidity, certValidity time.Duration
	allowShortValidity       bool
	force, dryRun            bool
}

func newServingOptions() servingOptions {
	return servingOptions{
		keyAlgorithm: string(pki.RSA2048),
		caValidity:   pki.DefaultCAValidity,
		certValidity: pki.DefaultCertValidity,
	}
}

// addFlags registers the flags; outSuffix names the default output directory, ./SERVICE-outSuffix.
func (o *servingOptions) addFlags(fs *pflag.FlagSet, what, outSuffix string) {
	fs.StringVar(&o.service, "service", o.service, "name of the Service in front of the "+what+" (required)")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "namespace of that Service (required)")
	fs.StringVar(&o.out, "out", o.out, "output directory (default ./SERVICE-"+outSuffix+")")
	fs.StringVar(&o.keyAlgorithm, "key-algorithm", o.keyAlgorithm, "algorithm of new keys: "+joinAlgorithms())
	fs.DurationVar(&o.caValidity, "ca-validity-period", o.caValidity, "lifetime of a new serving CA (at least "+minValidity.String()+")")
	fs.DurationVar(&o.certValidity, "cert-validity-period", o.certValidity, "lifetime of a new serving certificate (at least "+minValidity.String()+", unless --allow-short-validity)")
	fs.BoolVar(&o.allowShortValidity, "allow-short-validity", o.allowShortValidity, "accept a --cert-validity-period under "+minValidity.String()+": a certificate that expires before the next run, to see how clients take an expired one")
	fs.BoolVar(&o.force, "force", o.force, "renew a serving certificate that fails its checks, and replace files in --out that konnect did not write (a backup is kept beside each)")
	fs.BoolVar(&o.dryRun, "dry-run", o.dryRun, "print what would be written, and write nothing")
}

func (o *servingOptions) validate() []error {
	var errs []error
	for _, f := range []struct{ flag, v string }{{"--service", o.service}, {"--namespace", o.namespace}} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("%s is required", f.flag))
		}
	}
	if o.service != "" && o.namespace != "" {
		if err := pki.ValidateService(o.service, o.namespace); err != nil {
			errs = append(errs, fmt.Errorf("--service/--namespace: %w", err))
		}
	}
	if _, err := pki.ParseKeyAlgorithm(o.keyAlgorithm); err != nil {
		errs = append(errs, fmt.Errorf("--key-algorithm: %w", err))
	}
	minCert := minValidity
	if o.allowShortValidity {
		minCert = 0
	}
	if err := validities(o.caValidity, o.certValidity, minCert); err != nil {
		if o.certValidity > 0 && o.certValidity < minCert {
			err = fmt.Errorf("%w (--allow-short-validity issues one that expires sooner)", err)
		}
		errs = append(errs, err)
	}
	return errs
}

// outDir is --out made absolute, or ./SERVICE-suffix, refused when another user could change it (it will
// hold a CA key).
func (o *servingOptions) outDir(suffix string) (string, error) {
	out := o.out
	if out == "" {
		out = o.service + "-" + suffix
	}
	out, err := absDir("--out", out)
	if err != nil {
		return "", err
	}
	if err := safepath.CheckDir(out); err != nil {
		return "", fmt.Errorf("--out %s: %w; it will hold a CA key: make it root's (or yours) and closed to others", out, err)
	}
	return out, nil
}

// lock takes the lock of the output directory out, creating it, unless this is a dry run (see lockDir).
func (o *servingOptions) lock(stderr io.Writer, out string) (release func(), err error) {
	if o.dryRun {
		return func() {}, nil
	}
	return lockDir(stderr, "--out", out, true)
}

// pki is the configuration of the serving certificates in out/pki.
func (o *servingOptions) pki(out string) pki.Config {
	return pki.Config{
		Dir: filepath.Join(out, pki.PKISubdir), KeyAlgorithm: pki.KeyAlgorithm(o.keyAlgorithm),
		CAValidity: o.caValidity, CertValidity: o.certValidity, Force: o.force, DryRun: o.dryRun,
	}
}

// ensure creates or checks the serving CA and certificate in out/pki and reports on them through r.
func (o *servingOptions) ensure(r *runner, out string) (pki.ServingBundle, error) {
	res, bundle, err := pki.EnsureServing(o.pki(out), o.service, o.namespace)
	for _, x := range res {
		r.add(x)
	}
	return bundle, err
}

type apiServiceOptions struct {
	servingOptions
	group          string
	versions       []string
	serviceAccount string
}

func newAPIServiceCommand() *cobra.Command {
	o := &apiServiceOptions{servingOptions: newServingOptions()}
	cmd := &cobra.Command{
		Use:   "apiservice --service NAME --namespace NS --group G --version V [--version V2...]",
		Short: "Issue the serving CA and certificate of an extension API server, with its Secret, APIService and RBAC",
		Long: `Issue what an extension API server behind the aggregation layer needs, into --out (default
./NAME-apiservice):

  OUT/pki/ca.{crt,key}     serving CA; its certificate is the APIService's caBundle
  OUT/pki/tls.{crt,key}    serving certificate, CN NAME.NS.svc, SANs NAME.NS.svc and NAME.NS.svc.cluster.local
  OUT/*.yaml               kubernetes.io/tls Secret, an APIService VERSION.GROUP for each --version with that
                           caBundle (never insecureSkipTLSVerify), ClusterRoleBinding to system:auth-delegator,
                           RoleBinding in kube-system to extension-apiserver-authentication-reader
  OUT/kustomization.yaml   so that "kubectl apply -k OUT" applies them

Give every version the server serves in one run: the directory describes the whole server, and a later
run with other versions replaces the APIServices it lists. Existing files are checked and kept, as with
konnect init.`,
		Example: "  konnect certs apiservice --service api --namespace pizza-apiserver --group restaurant.example.com --version v1alpha1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	o.addFlags(fs, "extension API server", "apiservice")
	fs.StringVar(&o.group, "group", o.group, "API group the extension API server serves (required)")
	// An array split here, not pflag's StringSlice, which reads the value as CSV and keeps its first line
	// only: "v1\nv2" would be taken for v1 without a word.
	fs.StringArrayVar(&o.versions, "version", o.versions, "API version it serves (required; repeat or separate with commas for several)")
	fs.StringVar(&o.serviceAccount, "service-account", o.serviceAccount, "ServiceAccount of the extension API server in --namespace (default: --service)")
	return cmd
}

func (o *apiServiceOptions) validate() error {
	var versions []string
	for _, v := range o.versions {
		versions = append(versions, strings.Split(v, ",")...)
	}
	o.versions = versions
	errs := o.servingOptions.validate()
	if o.group == "" {
		errs = append(errs, fmt.Errorf("--group is required"))
	}
	if len(o.versions) == 0 {
		errs = append(errs, fmt.Errorf("--version is required"))
	}
	return errors.Join(errs...)
}

func (o *apiServiceOptions) run(cmd *cobra.Command) error {
	if err := o.validate(); err != nil {
		return err
	}
	out, err := o.outDir("apiservice")
	if err != nil {
		return err
	}
	release, err := o.lock(cmd.ErrOrStderr(), out)
	if err != nil {
		return err
	}
	defer release()
	spec := manifests.APIService{
		Service: o.service, Namespace: o.namespace, Group: o.group, Versions: o.versions,
		ServiceAccount: o.serviceAccount,
	}
	// Check the manifest inputs before any certificate is written.
	probe := spec
	placeholder := func(t string) []byte { return pem.EncodeToMemory(&pem.Block{Type: t}) }
	probe.CACert, probe.Cert, probe.Key = placeholder("CERTIFICATE"), placeholder("CERTIFICATE"), placeholder("PRIVATE KEY")
	if err := probe.Validate(); err != nil {
		return err // names the flag
	}
	for _, name := range manifests.APIServiceFiles {
		// Copied there by an older konnect, whose certs webhook took any name but two: replacing it would
		// drop the webhook from the directory, and the next rotate-ca would miss its caBundle.
		if old, err := smallfile.Read(filepath.Join(out, name)); err == nil && isWebhookCopy(old) {
			return fmt.Errorf("%s: certs webhook copied a webhook manifest there, and certs apiservice writes its own %s: rename that manifest, run certs webhook with it again, then remove %s",
				filepath.Join(out, name), name, filepath.Join(out, name))
		}
	}
	if _, err := servingKustomization(out, nil); err != nil {
		return err
	}
	r := &runner{o: &Options{DryRun: o.dryRun, Force: o.force}, out: cmd.OutOrStdout()}
	defer r.print()
	bundle, err := o.ensure(r, out)
	if err != nil {
		return err
	}
	if bundle.Cert == nil { // dry run on a fresh directory: the manifests depend on certificates not yet issued
		r.outcomes = append(r.outcomes, outcome{action: pki.Created, dryRun: true, file: filepath.Join(out, "(Secret, APIService, RBAC, kustomization.yaml)")})
		return nil
	}
	spec.CACert, spec.Cert, spec.Key = bundle.CA, bundle.Cert, bundle.Key
	files, err := spec.Render()
	if err != nil {
		return err
	}
	// Render lists its own files only; the directory's kustomization.yaml may list a webhook's too.
	files = slices.DeleteFunc(files, func(f manifests.File) bool { return f.Name == "kustomization.yaml" })
	k, err := servingKustomization(out, files)
	if err != nil {
		return err
	}
	files = append(files, k)
	listed := filepath.Join(out, manifests.APIServiceFile)
	dropped := slices.DeleteFunc(apiServiceNames(listed), func(n string) bool { return slices.Contains(spec.Names(), n) })
	if err := r.writeFiles(out, files); err != nil {
		return err
	}
	if len(dropped) > 0 {
		r.outcomes = append(r.outcomes, outcome{action: pki.Updated, dryRun: o.dryRun, file: listed,
			note: "no longer lists " + strings.Join(dropped, ", ") + ", which a cluster that applied it still has; give every version the server serves with --version"})
	}
	return nil
}

// apiServiceNames are the APIServices a file written by an earlier run lists; none if it cannot be read.
func apiServiceNames(path string) []string {
	objs, _ := manifests.ObjectsIn(path)
	var names []string
	for _, obj := range objs {
		if obj.Kind == "APIService" && obj.Name != "" {
			names = append(names, obj.Name)
		}
	}
	return names
}

// writeFiles writes rendered manifests atomically, each only when its content changes.
func (r *runner) writeFiles(dir string, files []manifests.File) error {
	for _, f := range files {
		if err := r.write(filepath.Join(dir, f.Name), f.Data, f.Mode); err != nil {
			return err
		}
	}
	return nil
}
