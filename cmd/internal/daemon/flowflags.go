package daemon

import (
	"errors"
	"fmt"

	"github.com/konnect-dev/konnect/egress/konnectivity/flow"
	"github.com/spf13/pflag"
)

// FlowControl holds the per-connection flow-control flags that `konnect server` and `konnect agent` share
// (docs/flow-control.md).
type FlowControl struct {
	Enabled   bool // --flow-control
	Window    int  // --flow-control-window-bytes
	MaxWindow int  // --flow-control-max-window-bytes
}

// NewFlowControl returns the defaults: on, with flow.DefaultWindow growing to flow.DefaultMaxWindow.
func NewFlowControl() FlowControl {
	return FlowControl{Enabled: true, Window: flow.DefaultWindow, MaxWindow: flow.DefaultMaxWindow}
}

// AddFlags registers the flags; peer names the other end ("servers" or "agents").
func (f *FlowControl) AddFlags(fs *pflag.FlagSet, peer string) {
	fs.BoolVar(&f.Enabled, "flow-control", f.Enabled, fmt.Sprintf(
		"konnect: per-connection flow control with %s that speak it (konnect's own; upstream's do not, and get the unextended protocol): "+
			"a connection whose reader is slow holds back only itself, never the stream it shares with the others (ANP issue 180).", peer))
	fs.IntVar(&f.Window, "flow-control-window-bytes", f.Window, fmt.Sprintf(
		"konnect: with --flow-control, the window each new connection starts with: how much data %s may send it before this end grants more (%d to %d).",
		peer, flow.MinWindow, flow.MaxWindow))
	fs.IntVar(&f.MaxWindow, "flow-control-max-window-bytes", f.MaxWindow, fmt.Sprintf(
		"konnect: with --flow-control, the largest a connection's window grows to while its reader keeps up, and so the most memory one connection may hold here (--flow-control-window-bytes to %d).",
		flow.MaxWindow))
}

// Validate checks the window flags, naming the flag in each error.
func (f *FlowControl) Validate() error {
	if !f.Enabled {
		return nil
	}
	var errs []error
	if f.Window < flow.MinWindow || f.Window > flow.MaxWindow {
		errs = append(errs, fmt.Errorf("--flow-control-window-bytes: must be between %d and %d, got %d", flow.MinWindow, flow.MaxWindow, f.Window))
	} else if f.MaxWindow < f.Window || f.MaxWindow > flow.MaxWindow {
		errs = append(errs, fmt.Errorf("--flow-control-max-window-bytes: must be between --flow-control-window-bytes (%d) and %d, got %d",
			f.Window, flow.MaxWindow, f.MaxWindow))
	}
	return errors.Join(errs...)
}
