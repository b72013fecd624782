package daemon

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestAddKlogFlags(t *testing.T) {
	all := pflag.NewFlagSet("all", pflag.ContinueOnError)
	AddKlogFlags(all)
	for _, name := range []string{"v", "vmodule", "log-file", "logtostderr"} {
		if all.Lookup(name) == nil {
			t.Errorf("AddKlogFlags(fs): no --%s", name)
		}
	}

	some := pflag.NewFlagSet("some", pflag.ContinueOnError)
	some.Bool("logtostderr", false, "the command's own")
	AddKlogFlags(some, "v", "vmodule", "logtostderr")
	var got []string
	some.VisitAll(func(f *pflag.Flag) { got = append(got, f.Name) })
	if len(got) != 3 || some.Lookup("v") == nil || some.Lookup("vmodule") == nil {
		t.Errorf("AddKlogFlags(fs, v, vmodule, logtostderr) registered %v", got)
	}
	if f := some.Lookup("logtostderr"); f.Usage != "the command's own" {
		t.Errorf("AddKlogFlags replaced a flag the set had: %q", f.Usage)
	}
}
