// Package agentcmd is a placeholder until its command group is written.
package agentcmd

import "github.com/spf13/cobra"

func NewAgentCommand() *cobra.Command { return &cobra.Command{Use: "agent", Short: "(not yet implemented)"} }
