// Package sockscmd is a placeholder until its command group is written.
package sockscmd

import "github.com/spf13/cobra"

func NewSocksCommand() *cobra.Command { return &cobra.Command{Use: "socks", Short: "(not yet implemented)"} }

func NewKubeconfigCommand() *cobra.Command { return &cobra.Command{Use: "kubeconfig", Short: "(not yet implemented)"} }
