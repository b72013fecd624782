// Package doctorcmd is `konnect doctor`: it reads running Konnectivity servers' status from their admin ports,
// dials through a server as kube-apiserver does, and checks the extension servers kube-apiserver reaches.
package doctorcmd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/konnect-dev/konnect/egress/tunnel"
	"github.com/konnect-dev/konnect/manifests/kubeapiserver"
	"github.com/spf13/cobra"
)

// NewDoctorCommand returns `konnect doctor` with its status and dial subcommands.
func NewDoctorCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Inspect Konnectivity servers, and dial through them and to extension servers as kube-apiserver does",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(newStatusCommand(), newDialCommand(), newExtensionsCommand())
	return cmd
}

func newStatusCommand() *cobra.Command {
	var (
		admins  []string
		output  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each server's connected agents, their identifiers, connection age, flow control and last error",
		Long: `Queries the admin endpoint (/debug/agents) of one or more konnect servers and prints, for each server,
the agents it knows: connected or not, identifiers, remote address, connection age, per-connection flow
control and the last error (for example a failed token authentication).

FLOW CONTROL is the version of per-connection flow control the agent's streams negotiated (v1), or none:
upstream's proxy-agent and older konnect agents do not offer it, and on such an agent one slow reader can
stall the agent's other connections. A warning names those agents. A server older than this doctor does
not report it: the column says unknown.`,
		Example: `  konnect doctor status --admin-address 127.0.0.1:8133
  konnect doctor status --admin-address 10.0.0.1:8133,10.0.0.2:8133 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o/--output must be table or json, not %q", output)
			}
			if len(admins) == 0 {
				return fmt.Errorf("--admin-address: give at least one server's admin address")
			}
			if err := positiveTimeout(timeout); err != nil {
				return err
			}
			results := make([]serverResult, 0, len(admins))
			failed := 0
			for _, a := range admins {
				st, err := fetchStatus(cmd.Context(), a, timeout)
				r := serverResult{Admin: a, Status: st}
				if err != nil {
					r.Error = err.Error()
					failed++
				}
				results = append(results, r)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(results); err != nil {
					return err
				}
			} else {
				printStatus(out, results, time.Now())
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d servers did not answer", failed, len(admins))
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&admins, "admin-address", []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(konnectivity.AdminPort))},
		"Admin address(es) (host:port) of the servers to ask. The default is the admin port of the static pod konnect init writes; a server left at upstream proxy-server's default admin port answers on 8095.")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "Output format: table or json.")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "How long to wait for each server.")
	return cmd
}

type serverResult struct {
	Admin  string         `json:"admin"`
	Status *tunnel.Status `json:"status,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// adminClient asks servers' admin ports directly. Those are node or pod addresses, never behind the
// HTTP(S)_PROXY that a shell or a node may set for the outside world (Go's default client would use it for
// every address that is not loopback).
var adminClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func fetchStatus(ctx context.Context, admin string, timeout time.Duration) (*tunnel.Status, error) {
	if _, _, err := net.SplitHostPort(admin); err != nil {
		return nil, fmt.Errorf("--admin-address %q: %w", admin, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/debug/agents", nil)
	if err != nil {
		return nil, err
	}
	res, err := adminClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", admin, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ask %s: %s (is this a konnect server's admin port?)", admin, res.Status)
	}
	var st tunnel.Status
	if err := json.NewDecoder(io.LimitReader(res.Body, 8<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("ask %s: decode status: %w", admin, err)
	}
	return &st, nil
}

func printStatus(w io.Writer, results []serverResult, now time.Time) {
	for i, r := range results {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if r.Status == nil {
			fmt.Fprintf(w, "server %s: UNREACHABLE: %s\n", r.Admin, r.Error)
			continue
		}
		st := r.Status
		connected := 0
		for _, a := range st.Agents {
			if a.Connected {
				connected++
			}
		}
		state := "serving"
		if st.Draining {
			state = "draining"
		}
		fmt.Fprintf(w, "server %s (id %s, %s, frontend %s, agents on %s, server-count %d): %s, %d agent(s) connected, %d open tunnel(s)\n",
			r.Admin, st.ServerID, st.Mode, st.Frontend, st.Agent, st.ServerCount, state, connected, st.Frontends)
		if len(st.Agents) == 0 {
			fmt.Fprintln(w, "  no agent has connected: dials through this server fail with \"No agent available\"")
			continue
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  AGENT\tSTATE\tAGE\tFLOW CONTROL\tREMOTE\tIDENTIFIERS\tLAST ERROR")
		for _, a := range st.Agents {
			stateStr, age := "disconnected", "-"
			if a.Connected {
				stateStr = "connected"
				age = now.Sub(a.Since).Round(time.Second).String()
			}
			lastErr := "-"
			if a.LastError != "" {
				lastErr = fmt.Sprintf("%s (%s ago)", a.LastError, now.Sub(a.LastErrorAt).Round(time.Second))
			}
			idents := a.Identifiers
			if idents == "" {
				idents = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, stateStr, age, flowControlCell(a), a.Remote, idents, lastErr)
		}
		tw.Flush()
		printFlowControlWarning(w, st)
	}
}

// flowControlCell is an agent's FLOW CONTROL: the version its connected streams negotiated, "none", or, for
// an agent with streams of both kinds, each kind with its count of streams. A server older than the field
// does not say: "unknown".
func flowControlCell(a tunnel.AgentStatus) string {
	switch {
	case !a.Connected:
		return "-"
	case len(a.FlowControl) == 0:
		return "unknown"
	case len(a.FlowControl) == 1:
		for fc := range a.FlowControl {
			return fc
		}
	}
	kinds := make([]string, 0, len(a.FlowControl))
	for _, fc := range slices.Sorted(maps.Keys(a.FlowControl)) {
		kinds = append(kinds, fmt.Sprintf("%s×%d", fc, a.FlowControl[fc]))
	}
	return strings.Join(kinds, ",")
}

// printFlowControlWarning names the connected agents of st that run without per-connection flow control
// (docs/flow-control.md) on any stream, and those whose flow control the server does not report.
func printFlowControlWarning(w io.Writer, st *tunnel.Status) {
	var without, unknown []string
	for _, a := range st.Agents {
		switch {
		case !a.Connected:
		case len(a.FlowControl) == 0:
			unknown = append(unknown, a.ID)
		case a.FlowControl[flow.None] > 0:
			without = append(without, a.ID)
		}
	}
	const stall = "one slow reader can stall the other connections of that agent, as with upstream (ANP issue 180)"
	switch {
	case len(without) == 0:
	case st.FlowControl == flow.None:
		fmt.Fprintf(w, "  warning: this server runs with --flow-control=false: its agents have no per-connection flow control, and %s\n", stall)
	default:
		fmt.Fprintf(w, "  warning: no per-connection flow control on %d agent(s): %s: %s; upgrade them to a konnect agent that offers it (upstream's proxy-agent and older konnect agents do not)\n",
			len(without), strings.Join(without, ", "), stall)
	}
	if len(unknown) > 0 {
		fmt.Fprintf(w, "  note: flow control unknown for %s: this server's status does not report it (a konnect server older than this doctor); "+
			"its /metrics may count the streams in konnect_tunnel_server_agent_streams{flow_control}\n", strings.Join(unknown, ", "))
	}
}

func newDialCommand() *cobra.Command {
	var (
		f       tunnel.Frontend
		timeout time.Duration
		request string
	)
	cmd := &cobra.Command{
		Use:   "dial ADDRESS [--uds-name PATH]",
		Short: "Dial ADDRESS through a server's frontend exactly as kube-apiserver does, and report why it fails",
		Long: `Dials host:port through the Konnectivity server's frontend socket the way kube-apiserver's egress
selector does (a single-use konnectivity-client gRPC tunnel, or HTTP CONNECT), then reports the latency or
the precise failure: no agent connected, dial timeout, refused connection, no route, or a server that is
not there. With --request, it sends one HTTP/1.1 request through the tunnel and prints the status line.
--uds-name defaults to the socket of the static pod konnect init writes, as doctor status defaults to its
admin port.`,
		Example: `  konnect doctor dial 10.96.0.1:443
  konnect doctor dial 127.0.0.1:8080 --uds-name _demo/konnectivity-server/konnectivity-server.socket --request 'GET /'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr := args[0]
			if err := checkDialAddress(addr); err != nil {
				return err
			}
			if f.UDSName == "" {
				return fmt.Errorf("--uds-name must not be empty: it is the server's frontend socket")
			}
			if err := positiveTimeout(timeout); err != nil {
				return err
			}
			if f.Mode != "grpc" && f.Mode != "http-connect" {
				return fmt.Errorf("--mode must be grpc or http-connect, not %q", f.Mode)
			}
			method, path, err := parseRequest(request)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			start := time.Now()
			conn, err := f.Dial(ctx, addr)
			took := time.Since(start)
			if err != nil {
				reason := Reason(err)
				if reason == "" {
					reason = "unrecognised failure"
				}
				fmt.Fprintf(out, "FAIL dial %s through %s (%s) after %s\n  error:  %v\n  reason: %s\n", addr, f.UDSName, f.Mode, took.Round(time.Microsecond), err, reason)
				return fmt.Errorf("dial %s: %s", addr, reason)
			}
			defer conn.Close()
			fmt.Fprintf(out, "OK dial %s through %s (%s) in %s\n", addr, f.UDSName, f.Mode, took.Round(time.Microsecond))
			if method == "" {
				return nil
			}
			_ = conn.SetDeadline(time.Now().Add(timeout))
			start = time.Now()
			if _, err := fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: konnect-doctor\r\nConnection: close\r\n\r\n", method, path, addr); err != nil {
				return fmt.Errorf("send request through the tunnel: %w", err)
			}
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil {
				return fmt.Errorf("read response through the tunnel: %w", err)
			}
			fmt.Fprintf(out, "%s (%s)\n", strings.TrimRight(line, "\r\n"), time.Since(start).Round(time.Microsecond))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.UDSName, "uds-name", kubeapiserver.DefaultUDSName, "The server's frontend socket (its --uds-name). The default is the socket of the static pod konnect init writes.")
	fl.StringVar(&f.Mode, "mode", "grpc", "Frontend protocol: grpc or http-connect (the server's --mode).")
	fl.DurationVar(&timeout, "timeout", 30*time.Second, "Dial timeout (kube-apiserver uses 30s) and request timeout.")
	fl.StringVar(&request, "request", "", "Send one HTTP/1.1 request through the tunnel, e.g. 'GET /', and print the status line.")
	return cmd
}

// checkDialAddress refuses, before anything is sent, an ADDRESS that no agent could dial: the agent would
// answer with a failure of its own that says nothing of the address.
func checkDialAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("ADDRESS %q must be host:port: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("ADDRESS %q must be host:port: the host is empty", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("ADDRESS %q: port %q is not a number from 1 to 65535", addr, port)
	}
	return nil
}

func parseRequest(s string) (method, path string, err error) {
	if s == "" {
		return "", "", nil
	}
	parts := strings.Fields(s)
	if len(parts) != 2 || !strings.HasPrefix(parts[1], "/") {
		return "", "", errors.New("--request must be 'METHOD /path', e.g. 'GET /'")
	}
	return strings.ToUpper(parts[0]), parts[1], nil
}

// positiveTimeout refuses a --timeout that would fail every check before it starts.
func positiveTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("--timeout must be positive, not %v", d)
	}
	return nil
}
