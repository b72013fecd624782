// Package proxycmd is a placeholder until its command group is written.
package proxycmd

import "github.com/spf13/cobra"

func NewProxyCommand() *cobra.Command { return &cobra.Command{Use: "proxy", Short: "(not yet implemented)"} }
