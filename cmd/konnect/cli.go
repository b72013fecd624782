package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// suggestSubcommands makes a mistyped subcommand of a command group ("konnect certs renw") an error that
// names the nearest subcommands. cobra does that only for the root command: a group's own Args (NoArgs)
// would answer with a bare "unknown command".
func suggestSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		suggestSubcommands(sub)
	}
	if !c.HasParent() || !c.HasSubCommands() {
		return
	}
	if !c.Runnable() {
		// cobra answers a group that cannot run with its help before it checks the arguments.
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	args := c.Args
	c.Args = func(cmd *cobra.Command, a []string) error {
		if len(a) > 0 {
			return unknownSubcommand(cmd, a[0])
		}
		if args != nil {
			return args(cmd, a)
		}
		return nil
	}
}

func unknownSubcommand(cmd *cobra.Command, name string) error {
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	msg := fmt.Sprintf("unknown command %q for %q", name, cmd.CommandPath())
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return fmt.Errorf("%s\n\nRun '%s --help' for its commands", msg, cmd.CommandPath())
}
