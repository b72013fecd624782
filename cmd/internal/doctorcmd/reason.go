package doctorcmd

import (
	"errors"
	"strings"

	"github.com/konnect-dev/konnect/egress/konnectivity"
	"github.com/konnect-dev/konnect/egress/tunnel"
)

// Reason explains a tunnel.Frontend Dial error in the terms an operator acts on (the failures users meet:
// k0s issues 1352 and 5809). It returns "" for an error it does not recognise. It matches errors, never the
// wire's spelling (konnectivity.Classify reads that); the flags it names are doctor's advice.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	err = konnectivity.Classify(err)
	is := func(reason error) bool { return errors.Is(err, reason) }
	var fe *tunnel.FrontendError
	switch {
	case errors.As(err, &fe):
		switch {
		case is(konnectivity.ErrNoSuchFile):
			return "the server's socket does not exist: is konnect server running with this --uds-name?"
		case is(konnectivity.ErrConnectionRefused):
			return "nothing listens on the server's socket or port: the server is down or still starting"
		case is(konnectivity.ErrPermissionDenied):
			return "no permission on the server's socket: run as its owner or group"
		case is(tunnel.ErrOtherMode) || strings.Contains(err.Error(), "malformed HTTP response"):
			// An http-connect server answered gRPC's preface in HTTP/1.1, or a gRPC server's frames were read as
			// an HTTP/1.1 response.
			return "the server speaks the other protocol: use its --mode (grpc or http-connect)"
		}
		return "cannot reach the konnectivity server"
	case is(konnectivity.ErrNoAgent):
		return "no agent is connected to this server (or none matches the destination): check `konnect doctor status` and the agents' logs"
	case is(konnectivity.ErrTooManyDials):
		return "the server already holds --max-pending-dials dials that agents have not answered: an agent is stuck or overloaded (konnect_tunnel_server_pending_dials on the server's /metrics)"
	case is(konnectivity.ErrDialTimeout):
		return "the agent did not answer in time: the agent is overloaded or stuck, or the destination drops packets"
	case is(konnectivity.ErrConnectionRefused):
		return "the agent reached the destination host, but nothing listens on that port"
	case is(konnectivity.ErrIOTimeout):
		return "the agent's dial to the destination timed out: the destination drops packets or is down"
	case is(konnectivity.ErrUnreachable):
		return "the agent has no route to the destination"
	case is(konnectivity.ErrNoSuchHost):
		return "the agent cannot resolve the destination's name"
	case is(konnectivity.ErrDraining):
		return "the agent is draining (shutting down); the next dial goes to another agent"
	case is(konnectivity.ErrNotAllowed):
		return "the agent's --allow-destination list does not include this address and port"
	case is(konnectivity.ErrTunnelClosed):
		return "the server closed the tunnel during the dial (server or agent went away)"
	}
	return ""
}
