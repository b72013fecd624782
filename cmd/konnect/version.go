package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/konnect-dev/konnect/cmd/internal/buildinfo"
	"github.com/spf13/cobra"
)

type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	// ANP is the apiserver-network-proxy module the tunnel is built on; its wire protocol is what peers must speak.
	ANP string `json:"apiserverNetworkProxy"`
}

func currentVersion() versionInfo {
	v := versionInfo{Version: buildinfo.Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "sigs.k8s.io/apiserver-network-proxy" {
				v.ANP = d.Version
			}
		}
	}
	return v
}

// versionLine is what konnect version and konnect --version print.
func versionLine(v versionInfo) string {
	return fmt.Sprintf("konnect %s (%s, %s, apiserver-network-proxy %s)", v.Version, v.GoVersion, v.Platform, v.ANP)
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print konnect's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := currentVersion()
			switch output {
			case "", "text":
				fmt.Fprintln(cmd.OutOrStdout(), versionLine(v))
			case "json":
				b, _ := json.MarshalIndent(v, "", "  ")
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			default:
				return fmt.Errorf("--output: unknown format %q (want text or json)", output)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
