package initcmd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/konnect-dev/konnect/manifests"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/konnect-dev/konnect/pki/smallfile"
)

// DefaultKubeadmKubeconfig is kubeadm's admin kubeconfig on a control-plane node.
const DefaultKubeadmKubeconfig = "/etc/kubernetes/admin.conf"

const kubeadmConfigMapName = "ConfigMap " + kubeapiserver.KubeadmConfigNamespace + "/" + kubeapiserver.KubeadmConfigName

// kubeadm records in kubeadm's ClusterConfiguration what the flags phase changes (or changed) in kube-apiserver.
// It runs before the flags phase: a cluster it cannot update leaves kube-apiserver.yaml as it was.
func (r *runner) kubeadm([]string) error {
	if !r.o.Kubeadm {
		return nil
	}
	flags, err := r.o.apiserverFlags().Flags()
	if err != nil {
		return err
	}
	patch, err := r.manifestPatch(flags)
	if err != nil {
		return err
	}
	path := r.o.APIServerManifest
	data, err := smallfile.Read(path)
	if err != nil {
		return fmt.Errorf("%s: %w", r.o.manifestFlag(), err)
	}
	before, err := kubeapiserver.DecodePod(data, path)
	if err != nil {
		return fmt.Errorf("%s: %w", r.o.manifestFlag(), err)
	}
	managed := flagNames(flags)
	client, err := newKubeadmClient(r.o.KubeadmKubeconfig)
	if err != nil {
		return err
	}
	var rec kubeapiserver.KubeadmRecord
	changed := false
	err = updateKubeadmConfig(r.ctx, client, func(cm *corev1.ConfigMap) (bool, error) {
		old, err := kubeapiserver.ParseKubeadmRecord(cm.Annotations[kubeapiserver.KubeadmRecordAnnotation])
		if err != nil {
			return false, err
		}
		// The flags phase patches with the record as it is before this phase changes it, less the released
		// flags the user has set in the ClusterConfiguration since.
		forPatch, err := old.ForgetReclaimed(cm.Data[kubeapiserver.KubeadmConfigKey])
		if err != nil {
			return false, err
		}
		r.kubeadmRecord = &forPatch
		patch.Kubeadm = forPatch
		after := before.DeepCopy()
		if _, err := kubeapiserver.PatchPod(after, patch); err != nil {
			return false, fmt.Errorf("%s: %s: %w", r.o.manifestFlag(), path, err)
		}
		cc, newRec, ccChanged, err := kubeapiserver.RecordInClusterConfiguration(cm.Data[kubeapiserver.KubeadmConfigKey], old, before, after, managed)
		if err != nil {
			return false, err
		}
		rec = newRec
		changed = ccChanged || newRec.String() != old.String() || cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] == ""
		if !changed || r.o.DryRun {
			return false, nil
		}
		cm.Data[kubeapiserver.KubeadmConfigKey] = cc
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] = newRec.String()
		return true, nil
	})
	if err != nil {
		return err
	}
	var names []string
	for _, a := range rec.ExtraArgs {
		names = append(names, "--"+a.Name)
	}
	note := "ClusterConfiguration apiServer: extraArgs " + strings.Join(names, ", ") + "; extraVolumes " + strings.Join(rec.ExtraVolumes, ", ")
	r.outcomes = append(r.outcomes, outcome{action: actionFor(changed, true), dryRun: changed && r.o.DryRun, file: kubeadmConfigMapName, note: note})
	return nil
}

// flagNames are the flags konnect manages in kube-apiserver: those it sets. An optional flag it does not set is
// not konnect's, whatever its value: the ClusterConfiguration gets its own value back, and the flags phase the
// manifest (ManifestPatch.Kubeadm).
func flagNames(flags []kubeapiserver.Flag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Name)
	}
	return out
}

// kubeadmReadTimeout bounds the flags phase's read of the kubeadm-config ConfigMap when it runs alone: it patches
// kube-apiserver.yaml also while kube-apiserver is down (a repair), and then waits no longer than this for it.
const kubeadmReadTimeout = 15 * time.Second

// kubeadmRecordForPatch is kubeadm's record for the flags phase's patch (ManifestPatch.Kubeadm) with --kubeadm:
// the one the kubeadm phase of this run read, before it changed it, or else the ConfigMap's. A ConfigMap that
// cannot be read (kube-apiserver is down) is no error: the patch goes on without the record, and only puts back
// no optional flag that konnect released.
func (r *runner) kubeadmRecordForPatch() (kubeapiserver.KubeadmRecord, error) {
	if !r.o.Kubeadm {
		return kubeapiserver.KubeadmRecord{}, nil
	}
	if r.kubeadmRecord != nil {
		return *r.kubeadmRecord, nil
	}
	client, err := newKubeadmClient(r.o.KubeadmKubeconfig)
	if err != nil {
		return kubeapiserver.KubeadmRecord{}, err
	}
	ctx, cancel := context.WithTimeout(r.ctx, kubeadmReadTimeout)
	defer cancel()
	cm, err := client.CoreV1().ConfigMaps(kubeapiserver.KubeadmConfigNamespace).Get(ctx, kubeapiserver.KubeadmConfigName, metav1.GetOptions{})
	if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
		// kube-apiserver answered: the kubeconfig or the cluster is the wrong one, which a retry does not mend.
		return kubeapiserver.KubeadmRecord{}, fmt.Errorf("%s (--kubeadm-kubeconfig %s): %w", kubeadmConfigMapName, r.o.KubeadmKubeconfig, err)
	}
	if err != nil {
		fmt.Fprintf(r.errOut, "Warning: cannot read %s: %v\nPatching kube-apiserver.yaml without kubeadm's record: an optional flag konnect released (--enable-aggregator-routing), should kubeadm have written it back with konnect's value, does not get its value from before konnect back; run again once kube-apiserver answers.\n", kubeadmConfigMapName, err)
		return kubeapiserver.KubeadmRecord{}, nil
	}
	rec, err := kubeapiserver.ParseKubeadmRecord(cm.Annotations[kubeapiserver.KubeadmRecordAnnotation])
	if err == nil {
		rec, err = rec.ForgetReclaimed(cm.Data[kubeapiserver.KubeadmConfigKey])
	}
	if err != nil {
		return rec, fmt.Errorf("%s: %w", kubeadmConfigMapName, err)
	}
	return rec, nil
}

// newKubeadmClient is kubeadmClient; tests replace it.
var newKubeadmClient = kubeadmClient

func kubeadmClient(kubeconfig string) (kubernetes.Interface, error) {
	// client-go reads it whole and would block on a FIFO: refused first.
	if err := smallfile.Check(kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeadm-kubeconfig: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeadm-kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// updateKubeadmConfig reads the kubeadm-config ConfigMap, lets edit change it, and writes it back when edit says
// so, again on a conflict with another writer (kubeadm, or konnect on another node). It gives up after two
// minutes, or when ctx ends.
func updateKubeadmConfig(ctx context.Context, client kubernetes.Interface, edit func(*corev1.ConfigMap) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cms := client.CoreV1().ConfigMaps(kubeapiserver.KubeadmConfigNamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, kubeapiserver.KubeadmConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := cm.Data[kubeapiserver.KubeadmConfigKey]; !ok {
			return fmt.Errorf("it has no %s", kubeapiserver.KubeadmConfigKey)
		}
		write, err := edit(cm)
		if err != nil || !write {
			return err
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", kubeadmConfigMapName, err)
	}
	return nil
}

// NewResetCommand returns `konnect reset`.
func NewResetCommand() *cobra.Command {
	var (
		dir, manifest, kubeconfig string
		kubeadm, dryRun           bool
	)
	cmd := &cobra.Command{
		Use:   "reset",
		Short: "Take konnect out of this control-plane node's kube-apiserver (and, with --kubeadm, out of kubeadm's ClusterConfiguration)",
		Long: `Take konnect out of this control-plane node again.

kube-apiserver.yaml (--apiserver-manifest) loses what konnect changed, keeping a backup: the flags and
volumes konnect recorded on the pod get back what they had before konnect (or go), and so do the flags it
added on request, its --egress-selector-config-file and its annotations; kubelet then restarts
kube-apiserver without the egress selector. A flag or volume konnect did not set stays. With --kubeadm, the
flags konnect recorded in kubeadm's ClusterConfiguration get back the values they had before (kubeadm's own,
in the manifest), and the ClusterConfiguration loses konnect's extraArgs and extraVolumes: kubeadm upgrade
and join write none of them back. The Konnectivity server's static pod DIR/manifests/konnectivity-server.yaml
is removed if konnect wrote it (it carries the app.kubernetes.io/managed-by=konnect label), and kept
otherwise. Certificates, keys and the other files konnect init wrote stay. Delete the agents first
(kubectl delete -k DIR/konnectivity-agent), then run it on one control-plane node after the other, each
kube-apiserver Ready again before the next.`,
		Example: `  konnect reset --kubeadm`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			say := func(verb, what, note string) {
				if dryRun {
					verb = "would be " + verb
				}
				line := fmt.Sprintf("[%s] %s", verb, what)
				if note != "" {
					line += " (" + note + ")"
				}
				fmt.Fprintln(out, line)
			}
			var rec kubeapiserver.KubeadmRecord
			if kubeadm {
				client, err := newKubeadmClient(kubeconfig)
				if err != nil {
					return err
				}
				verb := string(pki.Kept)
				err = updateKubeadmConfig(cmd.Context(), client, func(cm *corev1.ConfigMap) (bool, error) {
					var err error
					if rec, err = kubeapiserver.ParseKubeadmRecord(cm.Annotations[kubeapiserver.KubeadmRecordAnnotation]); err != nil {
						return false, err
					}
					// A released flag the user has set in the ClusterConfiguration since keeps their value.
					if rec, err = rec.ForgetReclaimed(cm.Data[kubeapiserver.KubeadmConfigKey]); err != nil {
						return false, err
					}
					if cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] == "" || rec.Removed {
						return false, nil
					}
					cc, _, err := kubeapiserver.RemoveFromClusterConfiguration(cm.Data[kubeapiserver.KubeadmConfigKey], rec)
					if err != nil {
						return false, err
					}
					verb = string(pki.Updated)
					if dryRun {
						return false, nil
					}
					cm.Data[kubeapiserver.KubeadmConfigKey] = cc
					done := rec
					done.Removed = true
					cm.Annotations[kubeapiserver.KubeadmRecordAnnotation] = done.String()
					return true, nil
				})
				if err != nil {
					return err
				}
				say(verb, kubeadmConfigMapName, "konnect's extraArgs and extraVolumes taken out of the ClusterConfiguration")
			}
			if dryRun {
				data, err := smallfile.Read(manifest)
				if err != nil {
					return fmt.Errorf("--apiserver-manifest: %w", err)
				}
				pod, err := kubeapiserver.DecodePod(data, manifest)
				if err != nil {
					return err
				}
				changed, err := kubeapiserver.UnpatchPod(pod, rec)
				if err != nil {
					return fmt.Errorf("%s: %w", manifest, err)
				}
				say(string(actionFor(changed, true)), manifest, "")
			} else {
				res, err := kubeapiserver.UnpatchManifestFile(manifest, rec, "")
				if err != nil {
					return err
				}
				note := ""
				if res.Backup != "" {
					note = "backup " + res.Backup
				}
				say(string(actionFor(res.Changed, true)), manifest, note)
			}
			server := filepath.Join(dir, ManifestsSubdir, manifests.ServerPodFile)
			if _, err := os.Stat(server); err != nil {
				return nil
			}
			if why := notKonnects(server); why != "" {
				say(string(pki.Kept), server, why)
				return nil
			}
			if !dryRun {
				if err := os.Remove(server); err != nil {
					return err
				}
			}
			say("removed", server, "")
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", pki.DefaultDir, "the directory konnect init wrote into")
	fs.StringVar(&manifest, "apiserver-manifest", kubeapiserver.DefaultAPIServerManifest, "the kube-apiserver static pod manifest konnect init patched")
	fs.BoolVar(&kubeadm, "kubeadm", false, "also take konnect's flags and volumes out of kubeadm's ClusterConfiguration (ConfigMap "+kubeapiserver.KubeadmConfigNamespace+"/"+kubeapiserver.KubeadmConfigName+"), and put back in kube-apiserver.yaml the values kubeadm gives them")
	fs.StringVar(&kubeconfig, "kubeadm-kubeconfig", DefaultKubeadmKubeconfig, "kubeconfig with which --kubeadm updates the ConfigMap "+kubeapiserver.KubeadmConfigName)
	fs.BoolVar(&dryRun, "dry-run", false, "print what would change, and change nothing")
	return cmd
}

// notKonnects says why the static pod manifest at path is not one konnect init wrote (every object it writes
// carries manifests.ManagedByLabel), or "" when it is: reset removes only what konnect added.
func notKonnects(path string) string {
	data, err := smallfile.Read(path)
	if err != nil || !manifests.ManagedByKonnect(data, path) {
		return "not written by konnect: it lacks the " + manifests.ManagedByLabel + "=" + manifests.ManagedBy + " label"
	}
	return ""
}
