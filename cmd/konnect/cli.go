package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/konnect-dev/konnect/cmd/internal/initcmd"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/konnect-dev/konnect/pki"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
)

// suggestSubcommands makes a mistyped subcommand of a command group ("konnect certs renw") an error that
// names the nearest subcommands and lists them all. cobra does that only for the root command: a group's own
// Args (NoArgs) would answer with a bare "unknown command". So too when the subcommand's flags follow it
// ("konnect init phase bogus --dir X"): the group has none of them, and cobra would blame the flag.
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
	// pflag has set aside the arguments before the flag it refused. Subcommands inherit this function: theirs
	// are their own errors.
	group := c
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if a := cmd.Flags().Args(); cmd == group && len(a) > 0 {
			return unknownSubcommand(cmd, a[0])
		}
		return err
	})
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
	msg += "\n\nAvailable commands:"
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			msg += fmt.Sprintf("\n  %-*s %s", sub.NamePadding(), sub.Name(), sub.Short)
		}
	}
	return fmt.Errorf("%s\n\nRun '%s --help' for more", msg, cmd.CommandPath())
}

// flagValues are the shell completions of flags that take one of a few values, by flag name: every command
// with a flag of that name offers them (TestFlagCompletion checks that each such flag's help names them).
var flagValues = map[string][]string{
	"mode":          {string(kubeapiserver.ModeGRPC) + "\tgRPC tunnel (konnectivity-client)", string(kubeapiserver.ModeHTTPConnect) + "\tHTTP CONNECT"},
	"transport":     {string(kubeapiserver.TransportUDS) + "\tunix socket", string(kubeapiserver.TransportTCP) + "\tmTLS over TCP on 127.0.0.1"},
	"agent-auth":    {initcmd.AgentAuthToken + "\tprojected ServiceAccount token, checked by TokenReview", initcmd.AgentAuthMTLS + "\tclient certificate"},
	"key-algorithm": keyAlgorithms(),
	"step": {
		"1\tnew CA; caBundle holds the old and the new CA",
		"2\tserving certificate from the new CA",
		"3\tcaBundle holds the new CA alone",
	},
}

func keyAlgorithms() []string {
	var out []string
	for _, a := range pki.KeyAlgorithms() {
		out = append(out, string(a))
	}
	return out
}

// registerCompletions gives every flag in flagValues, and every --context, its values in c and below.
func registerCompletions(c *cobra.Command) error {
	for _, sub := range c.Commands() {
		if err := registerCompletions(sub); err != nil {
			return err
		}
	}
	for name, values := range flagValues {
		if c.Flags().Lookup(name) == nil {
			continue
		}
		values := values
		if err := c.RegisterFlagCompletionFunc(name, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return values, cobra.ShellCompDirectiveNoFileComp
		}); err != nil {
			return fmt.Errorf("%s --%s: %w", c.CommandPath(), name, err)
		}
	}
	if c.Flags().Lookup("context") != nil {
		if err := c.RegisterFlagCompletionFunc("context", completeContexts); err != nil {
			return fmt.Errorf("%s --context: %w", c.CommandPath(), err)
		}
	}
	return nil
}

// completeContexts offers the contexts of the command's --kubeconfig, else of $KUBECONFIG or ~/.kube/config,
// as kubectl does.
func completeContexts(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if f := cmd.Flags().Lookup("kubeconfig"); f != nil && f.Value.String() != "" {
		rules.ExplicitPath = f.Value.String()
	}
	cfg, err := rules.Load()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError | cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for name, ctx := range cfg.Contexts {
		names = append(names, name+"\tcluster "+ctx.Cluster)
	}
	sort.Strings(names)
	return names, cobra.ShellCompDirectiveNoFileComp
}
