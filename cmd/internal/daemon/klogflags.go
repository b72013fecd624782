package daemon

import (
	"flag"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// AddKlogFlags registers klog's flags on fs with dashes for underscores (--log-file, --logtostderr), the way
// upstream proxy-server and proxy-agent expose them, so that manifests passing them keep working. With
// names, only those are registered (kubectl proxy, for one, has only -v and --vmodule). A flag fs already
// has is left alone.
func AddKlogFlags(fs *pflag.FlagSet, names ...string) {
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	gfs.VisitAll(func(f *flag.Flag) {
		if len(names) > 0 && !slices.Contains(names, f.Name) {
			return
		}
		f.Name = strings.ReplaceAll(f.Name, "_", "-")
		if fs.Lookup(f.Name) == nil {
			fs.AddGoFlag(f)
		}
	})
}

// LogErrorsOnly makes klog write errors only, for a command's -q (ssh -q keeps only errors): informational
// lines and warnings are dropped, at any -v. A command's own failure is not a log line, and still shows.
func LogErrorsOnly() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs) // the same settings as the process's, not copies
	// stderrthreshold applies to logtostderr (klog's default) only once the legacy behaviour is off.
	_ = fs.Set("legacy_stderr_threshold_behavior", "false")
	_ = fs.Set("stderrthreshold", "ERROR")
}
