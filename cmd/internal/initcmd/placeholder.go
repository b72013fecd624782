// Package initcmd is a placeholder until its command group is written.
package initcmd

import "github.com/spf13/cobra"

func NewInitCommand() *cobra.Command { return &cobra.Command{Use: "init", Short: "(not yet implemented)"} }

func NewCertsCommand() *cobra.Command { return &cobra.Command{Use: "certs", Short: "(not yet implemented)"} }
