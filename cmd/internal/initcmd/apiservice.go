package initcmd

import (
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/cobra"
)

type apiServiceOptions struct {
	service, namespace, group, version string
	serviceAccount                     string
	out                                string
	keyAlgorithm                       string
	caValidity, certValidity           time.Duration
	force, dryRun                      bool
}

func newAPIServiceCommand() *cobra.Command {
	o := &apiServiceOptions{
		keyAlgorithm: string(pki.RSA2048),
		caValidity:   pki.DefaultCAValidity,
		certValidity: pki.DefaultCertValidity,
	}
	cmd := &cobra.Command{
		Use:   "apiservice --service NAME --namespace NS --group G --version V",
		Short: "Issue the serving CA and certificate of an extension API server, with its Secret, APIService and RBAC",
		Long: `Issue what an extension API server behind the aggregation layer needs, into --out (default
./NAME-apiservice):

  OUT/pki/ca.{crt,key}     serving CA; its certificate is the APIService's caBundle
  OUT/pki/tls.{crt,key}    serving certificate, CN NAME.NS.svc, SANs NAME.NS.svc and NAME.NS.svc.cluster.local
  OUT/*.yaml               kubernetes.io/tls Secret, APIService VERSION.GROUP with that caBundle (never
                           insecureSkipTLSVerify), ClusterRoleBinding to system:auth-delegator, RoleBinding
                           in kube-system to extension-apiserver-authentication-reader
  OUT/kustomization.yaml   so that "kubectl apply -k OUT" applies them

Existing files are checked and kept, as with konnect init.`,
		Example: "  konnect certs apiservice --service api --namespace pizza-apiserver --group restaurant.example.com --version v1alpha1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.service, "service", o.service, "name of the Service in front of the extension API server (required)")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "namespace of that Service (required)")
	fs.StringVar(&o.group, "group", o.group, "API group the extension API server serves (required)")
	fs.StringVar(&o.version, "version", o.version, "API version it serves (required)")
	fs.StringVar(&o.serviceAccount, "service-account", o.serviceAccount, "ServiceAccount of the extension API server in --namespace (default: --service)")
	fs.StringVar(&o.out, "out", o.out, "output directory (default ./SERVICE-apiservice)")
	fs.StringVar(&o.keyAlgorithm, "key-algorithm", o.keyAlgorithm, "algorithm of new keys: "+joinAlgorithms())
	fs.DurationVar(&o.caValidity, "ca-validity-period", o.caValidity, "lifetime of a new serving CA")
	fs.DurationVar(&o.certValidity, "cert-validity-period", o.certValidity, "lifetime of a new serving certificate")
	fs.BoolVar(&o.force, "force", o.force, "renew a serving certificate that fails its checks")
	fs.BoolVar(&o.dryRun, "dry-run", o.dryRun, "print what would be written, and write nothing")
	return cmd
}

func (o *apiServiceOptions) validate() error {
	var errs []error
	for _, f := range []struct{ flag, v string }{{"--service", o.service}, {"--namespace", o.namespace}, {"--group", o.group}, {"--version", o.version}} {
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
	if err := validities(o.caValidity, o.certValidity); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (o *apiServiceOptions) run(cmd *cobra.Command) error {
	if err := o.validate(); err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = o.service + "-apiservice"
	}
	out, err := absDir("--out", out)
	if err != nil {
		return err
	}
	spec := manifests.APIService{
		Service: o.service, Namespace: o.namespace, Group: o.group, Version: o.version,
		ServiceAccount: o.serviceAccount,
	}
	// Check the manifest inputs before any certificate is written.
	probe := spec
	placeholder := func(t string) []byte { return pem.EncodeToMemory(&pem.Block{Type: t}) }
	probe.CACert, probe.Cert, probe.Key = placeholder("CERTIFICATE"), placeholder("CERTIFICATE"), placeholder("PRIVATE KEY")
	if err := probe.Validate(); err != nil {
		return err // names the flag
	}
	r := &runner{o: &Options{DryRun: o.dryRun}, out: cmd.OutOrStdout()}
	defer r.print()
	cfg := pki.Config{
		Dir: filepath.Join(out, pki.PKISubdir), KeyAlgorithm: pki.KeyAlgorithm(o.keyAlgorithm),
		CAValidity: o.caValidity, CertValidity: o.certValidity, Force: o.force, DryRun: o.dryRun,
	}
	res, bundle, err := pki.EnsureAPIService(cfg, o.service, o.namespace)
	for _, x := range res {
		r.add(x)
	}
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
	return r.writeFiles(out, files)
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
