// Package servercmd is a placeholder until its command group is written.
package servercmd

import "github.com/spf13/cobra"

func NewServerCommand() *cobra.Command { return &cobra.Command{Use: "server", Short: "(not yet implemented)"} }

func NewDoctorCommand() *cobra.Command { return &cobra.Command{Use: "doctor", Short: "(not yet implemented)"} }
