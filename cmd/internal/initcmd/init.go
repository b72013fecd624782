// Package initcmd holds `konnect init` (with its phases) and `konnect certs`: the control-plane setup
// commands. It turns flags into the configurations of the pki, egress and manifests packages and writes
// what they render; it holds no certificate or manifest logic of its own.
//
// konnect init writes, under --dir (default /etc/kubernetes):
//
//	DIR/pki/BASENAME.{crt,key}                 each row of pki.Specs the flags call for (konnect init --help lists them)
//	DIR/konnectivity-server.conf               kubeconfig of the Konnectivity server
//	DIR/egress-selector-configuration.yaml     kube-apiserver --egress-selector-config-file
//	DIR/kube-apiserver.flags                   kube-apiserver flags, one --flag=value per line
//	DIR/manifests/konnectivity-server.yaml     Konnectivity server static pod
//	DIR/konnectivity-agent/                    agent DaemonSet, ServiceAccount, RBAC, kustomization.yaml
//	    (with --agent-auth mtls: the agents' certificate Secret, mode 0600, instead of the TokenReview RBAC)
//
// These paths are a stable interface.
package initcmd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// phase is one step of konnect init; the phase subcommands and their help come from this table.
type phase struct {
	name  string
	short string
	needs needs
	// subphases, each a name that run accepts; nil when the phase has none.
	subphases func() []subphase
	run       func(r *runner, names []string) error
}

type subphase struct{ name, short string }

func phases() []phase {
	return []phase{
		{
			name: "certs", short: "Create or check the certificates and keys in DIR/pki",
			needs: needs{addresses: true},
			subphases: func() []subphase {
				var out []subphase
				for _, s := range pki.Specs() {
					out = append(out, subphase{s.Name, s.Description})
				}
				return out
			},
			run: (*runner).certs,
		},
		{name: "kubeconfig", short: "Write DIR/" + pki.KubeconfigFile + " for the Konnectivity server", needs: needs{apiserverURL: true}, run: (*runner).kubeconfig},
		{name: "egress", short: "Write DIR/" + EgressConfigFile + " (kube-apiserver --egress-selector-config-file)", run: (*runner).egress},
		{name: "kubeadm", short: "With --kubeadm, record the flags and volumes the flags phase sets on kube-apiserver in kubeadm's ClusterConfiguration (ConfigMap " + kubeapiserver.KubeadmConfigNamespace + "/" + kubeapiserver.KubeadmConfigName + "), so that kubeadm upgrade and join keep them", run: (*runner).kubeadm},
		{name: "flags", short: "Write DIR/" + FlagsFile + " and, with --apiserver-manifest, patch the kube-apiserver static pod", run: (*runner).flags},
		{name: "manifests", short: "Write the Konnectivity server static pod to DIR/" + ManifestsSubdir + "/, and the agent DaemonSet, RBAC, kustomization.yaml to DIR/" + manifests.AgentBundleDir + "/", needs: needs{addresses: true, manifests: true}, run: (*runner).manifests},
	}
}

// NewInitCommand returns `konnect init`.
func NewInitCommand() *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Set up the aggregation layer and the Konnectivity tunnel on a control-plane node",
		Long: `Set up the aggregation layer and the Konnectivity tunnel on a control-plane node.

konnect init runs these phases in order (each also runs alone as "konnect init phase NAME"):
` + phaseList() + `
It writes, under --dir (default /etc/kubernetes):
` + outputList() + `
Existing CAs are never overwritten; existing certificates are checked and kept, and a second identical run
changes no byte. A leaf that fails its checks is an error naming the file, unless --force renews it.
With ca.crt but no ca.key (an external CA), the certificates it signs must already exist; they are checked.`,
		Example: `  konnect init --control-plane-address 198.18.0.1 --apiserver-url https://198.18.0.1:6443
  konnect init --dir ./_demo --control-plane-address 127.0.0.1 --apiserver-url https://127.0.0.1:6443 --dry-run`,
		Args: cobra.NoArgs,
		RunE: fieldFlags.RunE(func(cmd *cobra.Command, _ []string) error {
			all := needs{}
			for _, p := range phases() {
				all.addresses = all.addresses || p.needs.addresses
				all.apiserverURL = all.apiserverURL || p.needs.apiserverURL
				all.manifests = all.manifests || p.needs.manifests
			}
			r, err := newRunner(cmd, o, all)
			if err != nil {
				return err
			}
			defer r.release()
			for _, p := range phases() {
				if err := p.run(r, nil); err != nil {
					r.print()
					return fmt.Errorf("phase %s: %w", p.name, err)
				}
			}
			r.print()
			return nil
		}),
	}
	o.AddFlags(cmd.Flags())
	cmd.AddCommand(newPhaseCommand())
	return cmd
}

func newPhaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "phase",
		Short: "Run one phase of konnect init",
		Long:  "Run one phase of konnect init:\n" + phaseList(),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// With flags, a phase was meant (a script's empty $PHASE, say): running none is an error, not help.
			if cmd.Flags().NFlag() > 0 || len(args) > 0 {
				var names []string
				for _, p := range phases() {
					names = append(names, p.name)
				}
				return fmt.Errorf("name a phase: %s", strings.Join(names, ", "))
			}
			return cmd.Help()
		},
	}
	for _, p := range phases() {
		cmd.AddCommand(newPhaseSubcommand(p, ""))
	}
	// The phases' flags, hidden, so that "init phase --dir X bogus" is parsed as the phases would parse it:
	// --dir takes X, and bogus is left as an unknown phase, which the error names. Without them the flag
	// would be unknown here and blamed instead, and X could not be told from a phase name.
	NewOptions().AddFlags(cmd.Flags())
	cmd.Flags().VisitAll(func(f *pflag.Flag) { f.Hidden = true })
	return cmd
}

// newPhaseSubcommand builds `init phase P` (sub empty) or `init phase P SUB`.
func newPhaseSubcommand(p phase, sub string) *cobra.Command {
	o := NewOptions()
	use, short := p.name, p.short
	var names []string
	n := p.needs
	if sub != "" {
		use, names = sub, []string{sub}
		for _, sp := range p.subphases() {
			if sp.name == sub {
				short = sp.short
			}
		}
		// Only certificates with SANs are computed from the control-plane addresses.
		if s, ok := pki.Lookup(pki.Specs(), sub); ok {
			n.addresses = s.AltNames != nil
		}
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: fieldFlags.RunE(func(cmd *cobra.Command, _ []string) error {
			r, err := newRunner(cmd, o, n)
			if err != nil {
				return err
			}
			defer r.release()
			err = p.run(r, names)
			r.print()
			return err
		}),
	}
	if sub == "" && p.subphases != nil {
		var lines []string
		for _, sp := range p.subphases() {
			lines = append(lines, fmt.Sprintf("  %-28s %s", sp.name, sp.short))
			cmd.AddCommand(newPhaseSubcommand(p, sp.name))
		}
		cmd.Long = p.short + "; without a name, all that the flags call for:\n" + strings.Join(lines, "\n")
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func phaseList() string {
	var b strings.Builder
	for _, p := range phases() {
		fmt.Fprintf(&b, "  %-11s %s\n", p.name, p.short)
	}
	return b.String()
}

func outputList() string {
	var b strings.Builder
	for _, s := range pki.Specs() {
		fmt.Fprintf(&b, "  DIR/pki/%-37s %s\n", s.BaseName+".{crt,key}", s.Description)
	}
	for _, f := range [][2]string{
		{pki.KubeconfigFile, "kubeconfig of the Konnectivity server (client cert konnectivity-server-client, --apiserver-url)"},
		{EgressConfigFile, "EgressSelectorConfiguration for kube-apiserver's --egress-selector-config-file"},
		{FlagsFile, "kube-apiserver flags, one --flag=value per line"},
		{ManifestsSubdir + "/konnectivity-server.yaml", "Konnectivity server static pod (kubelet runs it when DIR is /etc/kubernetes)"},
		{manifests.AgentBundleDir + "/", "agent DaemonSet, ServiceAccount, RBAC (--agent-auth mtls: certificate Secret), kustomization.yaml: kubectl apply -k"},
	} {
		fmt.Fprintf(&b, "  DIR/%-41s %s\n", f[0], f[1])
	}
	return b.String()
}

// runner carries one invocation's options and collects what happened.
type runner struct {
	ctx      context.Context // the command's: what talks to a cluster stops with it
	o        *Options
	out      io.Writer
	errOut   io.Writer // warnings
	outcomes []outcome
	// release lets go of --dir's lock.
	release func()
	// egressKept: the egress phase ran in this run and found the configuration as it was.
	egressKept bool
	// kubeadmRecord is kubeadm's record as the kubeadm phase of this run read it; nil when it did not run.
	kubeadmRecord *kubeapiserver.KubeadmRecord
}

type outcome struct {
	action pki.Action
	dryRun bool
	file   string
	note   string
	diff   string // what a dry run would change in an existing file: a unified diff, or why it is not shown
}

func newRunner(cmd *cobra.Command, o *Options, n needs) (*runner, error) {
	if err := o.Complete(cmd.Flags()); err != nil {
		return nil, err
	}
	if err := o.Validate(n); err != nil {
		return nil, err
	}
	release := func() {}
	if !o.DryRun {
		var err error
		if release, err = lockDir(cmd.ErrOrStderr(), "--dir", o.Dir, true); err != nil {
			return nil, err
		}
	}
	return &runner{ctx: cmd.Context(), o: o, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), release: release}, nil
}

// lockWait bounds how long a command waits for another one that writes into the same directory. A whole
// konnect init takes seconds.
const lockWait = time.Minute

// lockDir takes the lock of dir (pki.Lock) for a command that writes into it, so that two such commands
// never interleave their writes, and says on stderr when it has to wait. Without create, a directory that
// does not exist is left so: the command will say what is missing. Errors name flag.
func lockDir(stderr io.Writer, flag, dir string, create bool) (release func(), err error) {
	release, err = pki.Lock(dir, lockWait, create, func(holder string) {
		who := "another konnect command"
		if holder != "" {
			who += " (pid " + holder + ")"
		}
		fmt.Fprintf(stderr, "Waiting for %s, which is writing into %s (at most %s)...\n", who, dir, lockWait)
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, dir, err)
	}
	return release, nil
}

func (r *runner) add(res pki.Result) {
	note := res.Reason
	if res.Forced {
		note += " with " + fieldFlags["Force"]
	}
	if res.Backup != "" {
		note += ", backup " + res.Backup
	}
	if res.External {
		note = strings.TrimPrefix(note+"; external CA", "; ")
	}
	switch {
	case res.Name == pki.KonnectivityAgentCA && res.Action == pki.Created:
		// kubeadm copies ca and front-proxy-ca to joining control-plane nodes, but knows nothing of this one.
		note = strings.TrimPrefix(note+"; with several control-plane nodes, copy it and its key to the same path on the others before init runs there: every server must trust the agents' certificate", "; ")
	case res.Name == pki.KonnectivityAgent && res.Action == pki.Renewed && strings.HasPrefix(res.Reason, "moved from"):
		note += "; re-apply " + filepath.Join(r.o.Dir, manifests.AgentBundleDir) + " at once: the server trusts only the new CA"
	}
	file := res.CertFile
	// One line per pair: DIR/pki/NAME.{crt,key}. A renewal re-signs the certificate and keeps the key; an
	// external CA has no key here.
	if res.KeyFile != "" && res.Action != pki.Renewed && !(res.External && res.CA) {
		file = strings.TrimSuffix(res.CertFile, ".crt") + ".{crt,key}"
	}
	r.outcomes = append(r.outcomes, outcome{action: res.Action, dryRun: res.DryRun, file: file, note: note})
}

// print summarises what was created, kept, renewed or updated. Of file contents it shows only the diff of a
// dry run, never that of a file that holds key material.
func (r *runner) print() {
	for _, oc := range r.outcomes {
		verb := string(oc.action)
		if oc.dryRun {
			verb = "would be " + verb
		}
		line := fmt.Sprintf("[%s] %s", verb, oc.file)
		if oc.note != "" {
			line += " (" + oc.note + ")"
		}
		fmt.Fprintln(r.out, line)
		if oc.diff != "" {
			fmt.Fprint(r.out, oc.diff)
		}
	}
	r.outcomes = nil
}

func (r *runner) certs(names []string) error {
	cfg := r.o.PKI()
	// Each certificate is printed once written: new RSA-4096 keys take seconds in all.
	printed := 0
	cfg.Progress = func(res pki.Result) {
		r.add(res)
		r.print()
		printed++
	}
	res, err := pki.Ensure(cfg, names...)
	for _, x := range res[min(printed, len(res)):] {
		r.add(x)
	}
	return err
}

func (r *runner) kubeconfig([]string) error {
	res, err := pki.EnsureKubeconfig(r.o.PKI(), r.o.APIServerURL)
	if err == nil {
		r.add(res)
	}
	return err
}

func (r *runner) egress([]string) error {
	data, err := r.o.selector().Marshal()
	if err != nil {
		return err
	}
	if err := r.write(filepath.Join(r.o.Dir, EgressConfigFile), marked(data, "init"), 0o644); err != nil {
		return err
	}
	r.egressKept = r.outcomes[len(r.outcomes)-1].action == pki.Kept
	return nil
}

func (r *runner) flags([]string) error {
	flags, err := r.o.apiserverFlags().Flags()
	if err != nil {
		return err
	}
	if r.o.APIServerManifest == "" {
		return r.writeFlags(flags)
	}
	patch, err := r.manifestPatch(flags)
	if err != nil {
		return err
	}
	if patch.Kubeadm, err = r.kubeadmRecordForPatch(); err != nil {
		return err
	}
	path := r.o.APIServerManifest
	r.keepUnannotated(patch, path)
	if !r.o.DryRun {
		// Before kube-apiserver.flags too: a refused phase writes nothing.
		if err := requireFiles(patch); err != nil {
			return fmt.Errorf("%s %s: %w", r.o.manifestFlag(), path, err)
		}
	}
	if err := r.writeFlags(flags); err != nil {
		return err
	}
	if r.o.DryRun {
		data, err := smallfile.Read(path)
		if err != nil {
			return fmt.Errorf("%s: %w", r.o.manifestFlag(), err)
		}
		patched, res, err := kubeapiserver.PatchManifest(data, path, patch)
		if err != nil {
			return fmt.Errorf("%s: %w", r.o.manifestFlag(), err)
		}
		r.outcomes = append(r.outcomes, outcome{action: actionFor(res.Changed, true), dryRun: res.Changed, file: path, note: patchNote(res),
			diff: dryRunDiff(path, data, patched, res.Changed)})
		return nil
	}
	res, err := kubeapiserver.PatchManifestFile(path, patch)
	if err != nil {
		return fmt.Errorf("%s: %w", r.o.manifestFlag(), err)
	}
	r.outcomes = append(r.outcomes, outcome{action: actionFor(res.Changed, true), file: path, note: patchNote(res)})
	return nil
}

// patchNote is the note on the outcome of a patched manifest, or one a dry run would patch: its backup, and
// which flags had another value before and what it was. Something else may depend on such a value (another
// front proxy on --requestheader-client-ca-file), and the backup and `konnect init reset` are the only ways
// back. The values are file paths, never file contents.
func patchNote(res kubeapiserver.PatchResult) string {
	var notes []string
	if res.Backup != "" {
		notes = append(notes, "backup "+res.Backup)
	}
	if len(res.Replaced) > 0 {
		parts := make([]string, len(res.Replaced))
		for i, f := range res.Replaced {
			parts[i] = fmt.Sprintf("--%s %s → %s", f.Name, quoteOdd(f.Old), quoteOdd(f.New))
		}
		notes = append(notes, "replaced "+strings.Join(parts, ", "))
	}
	return strings.Join(notes, "; ")
}

// quoteOdd quotes a value that is empty or holds a space, a comma or a character that is not printable, so that
// a line of the report stays one line and each value reads as one.
func quoteOdd(v string) string {
	if v == "" || strings.ContainsAny(v, " ,") || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(v)
	}
	return v
}

// writeFlags writes DIR/kube-apiserver.flags. It takes no mark: users hand its lines to kube-apiserver as
// they are (one --flag=value per line), and a comment would be an argument there. An existing file is
// konnect's when it holds nothing but such lines of flags konnect writes: one with any other line, a
// comment or another flag of the user's is refused unless --force.
func (r *runner) writeFlags(flags []kubeapiserver.Flag) error {
	names := slices.Clone(kubeapiserver.OptionalFlags)
	for _, f := range flags {
		names = append(names, f.Name)
	}
	onlyKonnects := func(old []byte) bool {
		for _, l := range strings.Split(strings.TrimSuffix(string(old), "\n"), "\n") {
			name, _, ok := strings.Cut(strings.TrimPrefix(l, "--"), "=")
			if !ok || !strings.HasPrefix(l, "--") || !slices.Contains(names, name) {
				return false
			}
		}
		return true
	}
	return r.replace(filepath.Join(r.o.Dir, FlagsFile), kubeapiserver.MarshalFlags(flags), 0o644, onlyKonnects)
}

// manifestPatch is what the flags phase sets on the kube-apiserver static pod.
func (r *runner) manifestPatch(flags []kubeapiserver.Flag) (kubeapiserver.ManifestPatch, error) {
	sel := r.o.selector()
	config, err := sel.Marshal()
	if err != nil {
		return kubeapiserver.ManifestPatch{}, err
	}
	return kubeapiserver.ManifestPatch{Flags: flags, Optional: kubeapiserver.OptionalFlags, UDSDir: sel.UDSDir(), Files: sel.Files(),
		Annotations: map[string]string{kubeapiserver.EgressConfigAnnotation: fmt.Sprintf("%x", sha256.Sum256(config))}}, nil
}

// keepUnannotated drops the egress configuration's annotation from patch when the manifest at path has none and
// the egress phase of this run kept the configuration as it was: kubeadm wrote the manifest anew from a
// ClusterConfiguration that carries konnect's flags (kubeadm join --control-plane, kubeadm upgrade), so
// kube-apiserver started with this configuration, and adding the annotation would only restart it.
func (r *runner) keepUnannotated(patch kubeapiserver.ManifestPatch, path string) {
	if !r.egressKept {
		return
	}
	data, err := smallfile.Read(path)
	if err != nil {
		return
	}
	if pod, err := kubeapiserver.DecodePod(data, path); err == nil && pod.Annotations[kubeapiserver.EgressConfigAnnotation] == "" {
		delete(patch.Annotations, kubeapiserver.EgressConfigAnnotation)
	}
}

// requireFiles refuses a patch that points kube-apiserver at a file that does not exist yet, as when the
// flags phase runs alone before the certs or egress phase: kube-apiserver would not start (and kubelet
// refuses a hostPath volume of type File that is missing), taking the control plane down with it.
func requireFiles(p kubeapiserver.ManifestPatch) error {
	files := slices.Clone(p.Files)
	for _, f := range p.Flags {
		if strings.HasSuffix(f.Name, "-file") {
			files = append(files, f.Value)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("kube-apiserver would not start: %w (run the certs and egress phases first)", err)
		}
	}
	return nil
}

func actionFor(changed, existed bool) pki.Action {
	switch {
	case !changed:
		return pki.Kept
	case existed:
		return pki.Updated
	}
	return pki.Created
}

// write writes a derived file atomically, only when its content or mode changes. The mode is the
// caller's: a manifest that names or holds key material is 0600. An existing file that konnect did not
// write (writtenByKonnect) is refused unless --force, which keeps a backup of it beside it.
func (r *runner) write(path string, data []byte, mode os.FileMode) error {
	return r.replace(path, data, mode, nil)
}

// replace is write, where also (nil for none) recognises more contents that data may replace without loss
// than writtenByKonnect does: an earlier copy of the manifest that data copies, say.
func (r *runner) replace(path string, data []byte, mode os.FileMode, also func(old []byte) bool) error {
	old, err := smallfile.Read(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Something konnect cannot read whole stands there (larger than any file it writes, a FIFO, a
		// directory): not its own, and not one it could keep a backup of, so it is refused even with --force.
		return fmt.Errorf("%w: konnect did not write this, and will not replace it: move it away", err)
	}
	existed := err == nil
	foreign := existed && !bytes.Equal(old, data) && !writtenByKonnect(path, old, data) && (also == nil || !also(old))
	if foreign && !r.o.Force {
		return fmt.Errorf("%s: konnect did not write this file (no %q line, no label %s=%s), so it will not replace it: move it away, or run with %s to replace it and keep a backup beside it (so too for a file an older konnect wrote that differs from this run's)",
			path, writtenBy, manifests.ManagedByLabel, manifests.ManagedBy, fieldFlags["Force"])
	}
	if r.o.DryRun {
		changed := !existed || !bytes.Equal(old, data)
		var diff, note string
		if existed {
			diff = dryRunDiff(path, old, data, changed)
		}
		if foreign {
			note = "not konnect's: replaced with " + fieldFlags["Force"] + ", a backup kept beside it"
		}
		r.outcomes = append(r.outcomes, outcome{action: actionFor(changed, existed), dryRun: changed, file: path, note: note, diff: diff})
		return nil
	}
	// A killed run's temporary file may hold a key (the agent's Secret): gone before the new write.
	pki.RemoveStaleTemps(path)
	note := ""
	if foreign {
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		backup, err := pki.Backup(path, "", old, st.Mode().Perm(), time.Now())
		if err != nil {
			return err
		}
		note = "not konnect's: replaced with " + fieldFlags["Force"] + ", backup " + backup
	}
	changed, err := pki.WriteFile(path, data, mode, 0o755)
	if err != nil {
		return err
	}
	r.outcomes = append(r.outcomes, outcome{action: actionFor(changed, existed), file: path, note: note})
	return nil
}

// writtenBy starts the first line of each file konnect writes that carries no label of its own to say so
// (marked; kube-apiserver.flags excepted), so that a later run knows the file for its own.
const writtenBy = "# Written by konnect"

// marked is YAML data with a first line that says konnect wrote it, for what (e.g. "init");
// data that has one already is returned as it is.
func marked(data []byte, what string) []byte {
	if bytes.HasPrefix(data, []byte(writtenBy)) {
		return data
	}
	return append([]byte(writtenBy+" "+what+"; a later run replaces this file.\n"), data...)
}

// writtenByKonnect reports whether old, the content of the file at path, is konnect's own, so that new may
// replace it: a file marked, one whose every object has konnect's managed-by label, one that holds new
// without its mark (an older konnect wrote it so), or a kustomization.yaml (its writers carry over what a
// user added).
func writtenByKonnect(path string, old, new []byte) bool {
	if bytes.HasPrefix(old, []byte(writtenBy)) || filepath.Base(path) == "kustomization.yaml" {
		return true
	}
	if _, rest, ok := bytes.Cut(new, []byte("\n")); ok && bytes.HasPrefix(new, []byte(writtenBy)) && bytes.Equal(old, rest) {
		return true
	}
	return manifests.ManagedByKonnect(old, path)
}

// dryRunDiff is the unified diff from old to new of the file at path, for a dry run to show what it would
// update, or a line saying why it is not shown: konnect never prints keys or tokens.
func dryRunDiff(path string, old, new []byte, changed bool) string {
	if !changed {
		return ""
	}
	if holdsSecrets(old) || holdsSecrets(new) {
		return "    (no diff shown: the file holds a key or token)\n"
	}
	diff, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(string(old)), B: difflib.SplitLines(string(new)),
		FromFile: path, ToFile: path + " (after this run)", Context: 3,
	})
	if err != nil {
		return fmt.Sprintf("    (no diff: %v)\n", err)
	}
	return diff
}

// secretKind matches a Kubernetes Secret: its data are base64, so no marker of the key inside shows.
var secretKind = regexp.MustCompile(`(?m)^kind:\s*Secret\s*$`)

// holdsSecrets reports whether a file konnect writes may carry a key or token: a PEM private key, a Secret,
// or a kubeconfig's credentials.
func holdsSecrets(data []byte) bool {
	return bytes.Contains(data, []byte("PRIVATE KEY")) || secretKind.Match(data) ||
		bytes.Contains(data, []byte("client-key-data")) || bytes.Contains(data, []byte("token:"))
}
