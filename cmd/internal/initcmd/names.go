package initcmd

import (
	"github.com/konnect-dev/konnect/cmd/internal/flagerr"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/spf13/cobra"
)

// fieldFlags are the flags of init and certs behind the Config fields that the libraries' errors name.
var fieldFlags = flagerr.Names{
	"Mode":      "--mode",
	"Transport": "--transport",
	"Force":     "--force",
	"Dir":       "--dir",
	"DryRun":    "--dry-run",
	// manifests.APIService, for certs apiservice.
	"Service":        "--service",
	"Namespace":      "--namespace",
	"Group":          "--group",
	"Versions":       "--version",
	"ServiceAccount": "--service-account",
}

// nameFields makes every command of the tree return its errors with fieldFlags' flags.
func nameFields(cmd *cobra.Command) {
	if cmd.RunE != nil {
		cmd.RunE = fieldFlags.RunE(cmd.RunE)
	}
	for _, c := range cmd.Commands() {
		nameFields(c)
	}
}

// modeValue is --mode as a pflag.Value. pflag prints what Set returns itself, so the flag boundary owns Set.
type modeValue struct{ m *kubeapiserver.Mode }

func (v modeValue) String() string { return string(*v.m) }
func (v modeValue) Type() string   { return "mode" }
func (v modeValue) Set(s string) error {
	m, err := kubeapiserver.ParseMode(s)
	if err != nil {
		return fieldFlags.Error(err)
	}
	*v.m = m
	return nil
}

// transportValue is --transport as a pflag.Value.
type transportValue struct{ t *kubeapiserver.Transport }

func (v transportValue) String() string { return string(*v.t) }
func (v transportValue) Type() string   { return "transport" }
func (v transportValue) Set(s string) error {
	t, err := kubeapiserver.ParseTransport(s)
	if err != nil {
		return fieldFlags.Error(err)
	}
	*v.t = t
	return nil
}
