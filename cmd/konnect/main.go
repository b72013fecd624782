// Command konnect sets up the Kubernetes aggregation layer, runs the Konnectivity tunnel, and gives
// developers SSH-backed access to remote API servers. See README.md.
package main

import (
	"fmt"
	"os"

	"github.com/konnect-dev/konnect/cmd/internal/agentcmd"
	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/konnect-dev/konnect/cmd/internal/daemon"
	"github.com/konnect-dev/konnect/cmd/internal/doctorcmd"
	"github.com/konnect-dev/konnect/cmd/internal/initcmd"
	"github.com/konnect-dev/konnect/cmd/internal/kubeconfigcmd"
	"github.com/konnect-dev/konnect/cmd/internal/proxycmd"
	"github.com/konnect-dev/konnect/cmd/internal/servercmd"
	"github.com/konnect-dev/konnect/cmd/internal/sockscmd"
	"github.com/konnect-dev/konnect/pki/interrupt"
	"github.com/spf13/cobra"
)

func main() {
	daemon.RedactSecretsInLogs()
	// An interrupted command leaves no temporary file or lock behind (daemons take the signals over).
	interrupt.Catch()
	root, err := newRootCommand()
	if err != nil {
		fmt.Fprintln(os.Stderr, "konnect:", err)
		os.Exit(1)
	}
	if err := root.Execute(); err != nil {
		// cobra has already printed the error with the command's name.
		os.Exit(1)
	}
}

func newRootCommand() (*cobra.Command, error) {
	root := &cobra.Command{
		Use:   "konnect",
		Short: "Aggregation-layer PKI, the Konnectivity tunnel, and developer access to remote API servers",
		Long: `konnect has three jobs:

  On a control-plane node:   konnect init, konnect certs      (aggregation-layer PKI, flags, manifests)
  The Konnectivity tunnel:   konnect server, konnect agent    (drop-in for proxy-server / proxy-agent)
  On a developer's laptop:   konnect socks, konnect proxy     (SSH SOCKS5/HTTP proxy, kubectl-proxy drop-in)`,
		SilenceUsage:  true,
		SilenceErrors: false,
		// --version, as `konnect version` prints it.
		Version: buildinfo.Version,
	}
	root.SetVersionTemplate(versionLine(currentVersion()) + "\n")
	root.AddGroup(
		&cobra.Group{ID: "control-plane", Title: "Control-plane setup:"},
		&cobra.Group{ID: "tunnel", Title: "Konnectivity tunnel:"},
		&cobra.Group{ID: "developer", Title: "Developer access:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("control-plane", initcmd.NewInitCommand(), initcmd.NewCertsCommand(), initcmd.NewResetCommand())
	add("tunnel", servercmd.NewServerCommand(), agentcmd.NewAgentCommand(), doctorcmd.NewDoctorCommand())
	add("developer", sockscmd.NewSocksCommand(), kubeconfigcmd.NewKubeconfigCommand(), proxycmd.NewProxyCommand())
	root.AddCommand(newVersionCommand())
	suggestSubcommands(root)
	if err := registerCompletions(root); err != nil {
		return nil, err
	}
	return root, nil
}
