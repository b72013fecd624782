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
