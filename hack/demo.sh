#!/usr/bin/env bash
# make demo: konnect's main job on a loopback "cluster", start to finish. It takes under a minute once konnect
# is built; the first build compiles konnect and everything it uses (about 780 packages: client-go, gRPC,
# apiserver-network-proxy), about 3 minutes on a 2-core machine, and later builds take seconds.
#   0. the ports are checked, and bin/konnect is built (unless KONNECT names a binary);
#   1. konnect init writes the aggregation-layer PKI, kubeconfig, egress config, apiserver flags and manifests
#      into ./_demo;
#   2. konnect server (UDS frontend, TLS agent port) and konnect agent (mTLS) start on loopback;
#   3. a small HTTP backend starts;
#   4. konnect doctor dial reaches the backend through the tunnel exactly as kube-apiserver would
#      (konnectivity-client, single-use gRPC tunnel over the UDS);
#   5. everything is stopped with SIGTERM and must exit cleanly; the last lines say what to try next.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DEMO=${DEMO_DIR:-_demo}
# Ports on loopback only; each has an override for a machine where it is taken.
AGENT_PORT=${DEMO_AGENT_PORT:-18132}
SERVER_ADMIN=${DEMO_SERVER_ADMIN_PORT:-18133}
SERVER_HEALTH=${DEMO_SERVER_HEALTH_PORT:-18134}
AGENT_HEALTH=${DEMO_AGENT_HEALTH_PORT:-18093}
AGENT_ADMIN=${DEMO_AGENT_ADMIN_PORT:-18094}

pids=()
started=0 # set once this run's logs exist
cleanup() {
	local status=$?
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [ $status -ne 0 ] && [ "$started" = 1 ]; then
		echo "demo failed; the last lines of each log:" >&2
		for f in "$DEMO"/logs/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
	fi
}
trap cleanup EXIT

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
# http_get http://HOST:PORT/PATH prints the body and succeeds only on HTTP 200. Plain bash (/dev/tcp), so that
# the demo needs nothing but Go on a fresh machine.
http_get() {
	local hostport=${1#http://} path status line
	path=/${hostport#*/}; hostport=${hostport%%/*}
	{ exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}"; } 2>/dev/null || return 1
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" >&3
	IFS= read -r -t 2 status <&3 || status=
	while IFS= read -r -t 2 line <&3 && [ -n "${line%$'\r'}" ]; do :; done
	timeout 2 cat <&3 || true
	exec 3<&-
	[[ $status == HTTP/1.?" 200"* ]]
}
wait_ready() { # name url pid
	for _ in $(seq 1 100); do
		if ! kill -0 "$3" 2>/dev/null; then echo "$1 exited before it was ready" >&2; return 1; fi
		if http_get "$2" >/dev/null; then echo "$1 is ready ($2)"; return 0; fi
		sleep 0.1
	done
	echo "$1 did not become ready at $2" >&2
	http_get "$2?verbose" >&2 || true
	return 1
}

# A port something already answers on would fail the server or agent after the build; say so first, with the
# variable that moves it.
taken=0
for var in DEMO_AGENT_PORT DEMO_SERVER_ADMIN_PORT DEMO_SERVER_HEALTH_PORT DEMO_AGENT_HEALTH_PORT DEMO_AGENT_ADMIN_PORT; do
	case $var in
	DEMO_AGENT_PORT) port=$AGENT_PORT ;; DEMO_SERVER_ADMIN_PORT) port=$SERVER_ADMIN ;;
	DEMO_SERVER_HEALTH_PORT) port=$SERVER_HEALTH ;; DEMO_AGENT_HEALTH_PORT) port=$AGENT_HEALTH ;;
	DEMO_AGENT_ADMIN_PORT) port=$AGENT_ADMIN ;;
	esac
	if { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
		exec 3<&-
		free=$((port + 10000)); [ $free -le 65535 ] || free=$((port - 10000))
		echo "make demo: port $port on 127.0.0.1 is taken (something answers there); set $var to a free port, e.g. $var=$free make demo" >&2
		taken=1
	fi
done
if [ $taken -ne 0 ]; then
	echo "make demo: the ports and their overrides: DEMO_AGENT_PORT=$AGENT_PORT DEMO_SERVER_ADMIN_PORT=$SERVER_ADMIN DEMO_SERVER_HEALTH_PORT=$SERVER_HEALTH DEMO_AGENT_HEALTH_PORT=$AGENT_HEALTH DEMO_AGENT_ADMIN_PORT=$AGENT_ADMIN" >&2
	exit 1
fi

if [ -z "${KONNECT:-}" ]; then
	KONNECT=bin/konnect
	step "building bin/konnect (go build ./cmd/konnect)"
	echo "A first build compiles konnect and everything it uses, about 780 packages (client-go, gRPC,"
	echo "apiserver-network-proxy): about 3 minutes on a 2-core machine. Later builds take seconds."
	# go build -v names each package it compiles: a count every 100 shows that the build moves.
	"$GO" build -v -ldflags "${KONNECT_LDFLAGS:-}" -o "$KONNECT" ./cmd/konnect 2>&1 |
		awk '/ |^#/ { print; next } { n++; if (n % 100 == 0) printf "  %d packages compiled\n", n } END { if (n) printf "  %d packages compiled\n", n }'
	[ -x "$KONNECT" ] || { echo "make demo: the build of bin/konnect failed" >&2; exit 1; }
fi

rm -rf "$DEMO" && mkdir -p "$DEMO/logs" && started=1
DEMO=$(cd "$DEMO" && pwd) # absolute, for the socket path; DEMO_DIR may be either
# konnect init's default for this --dir: a directory of its own, since kube-apiserver mounts it read-write.
SOCK="$DEMO/konnectivity-server/konnectivity-server.socket"
step "konnect init: PKI, kubeconfig, egress selector, kube-apiserver flags and manifests into $DEMO"
# There is no kube-apiserver here to review agent tokens, so the demo's agent authenticates with a client
# certificate (--agent-auth mtls: the server's --cluster-ca-cert, the agent's --agent-cert/--agent-key).
"$KONNECT" init --dir "$DEMO" --control-plane-address 127.0.0.1 --apiserver-url https://127.0.0.1:6443 \
	--agent-auth mtls --key-algorithm ecdsa-p256
echo; echo "kube-apiserver would be started with:"; sed 's/^/    /' "$DEMO/kube-apiserver.flags"
"$KONNECT" certs check-expiration --dir "$DEMO"

step "konnect server: gRPC frontend on the UDS, agents over mutual TLS on 127.0.0.1:$AGENT_PORT"
"$KONNECT" server --mode grpc --uds-name "$SOCK" --delete-existing-uds-file --server-port 0 \
	--cluster-cert "$DEMO/pki/konnectivity-server.crt" --cluster-key "$DEMO/pki/konnectivity-server.key" \
	--cluster-ca-cert "$DEMO/pki/konnectivity-agent-ca.crt" --agent-port "$AGENT_PORT" --admin-port "$SERVER_ADMIN" \
	--health-port "$SERVER_HEALTH" --agent-bind-address 127.0.0.1 --health-bind-address 127.0.0.1 \
	>"$DEMO/logs/server.log" 2>&1 &
pids+=($!); server_pid=$!
wait_ready "konnect server" "http://127.0.0.1:$SERVER_HEALTH/readyz" "$server_pid"

step "konnect agent: connects to the server with its client certificate"
"$KONNECT" agent --proxy-server-host 127.0.0.1 --proxy-server-port "$AGENT_PORT" --ca-cert "$DEMO/pki/ca.crt" \
	--agent-cert "$DEMO/pki/konnectivity-agent.crt" --agent-key "$DEMO/pki/konnectivity-agent.key" \
	--health-server-host 127.0.0.1 --health-server-port "$AGENT_HEALTH" --admin-server-port "$AGENT_ADMIN" --agent-identifiers host=demo-node \
	>"$DEMO/logs/agent.log" 2>&1 &
pids+=($!); agent_pid=$!
wait_ready "konnect agent" "http://127.0.0.1:$AGENT_HEALTH/readyz" "$agent_pid"

step "a small backend behind the agent"
# Built, not `go run`: go run does not pass SIGTERM on, and its child would outlive the demo.
go build -o "$DEMO/demo-backend" ./hack/demo-backend
"$DEMO/demo-backend" --port-file "$DEMO/backend.addr" >"$DEMO/logs/backend.log" 2>&1 &
pids+=($!); backend_pid=$!
for _ in $(seq 1 100); do
	[ -s "$DEMO/backend.addr" ] && break
	kill -0 "$backend_pid" 2>/dev/null || { echo "the backend exited before it was listening" >&2; exit 1; }
	sleep 0.1
done
[ -s "$DEMO/backend.addr" ] || { echo "the backend did not write $DEMO/backend.addr within 10s" >&2; exit 1; }
backend=$(cat "$DEMO/backend.addr"); echo "backend listening on $backend"

step "konnect doctor status: the agents the server holds"
"$KONNECT" doctor status --admin-address "127.0.0.1:$SERVER_ADMIN"

step "konnect doctor dial $backend: through the UDS, as kube-apiserver does"
"$KONNECT" doctor dial "$backend" --uds-name "$SOCK" --request "GET /through-the-tunnel"

step "SIGTERM to the agent and the server: both must drain and exit 0"
kill -TERM "$agent_pid"; wait "$agent_pid"; echo "agent exited with status $?"
kill -TERM "$server_pid"; wait "$server_pid"; echo "server exited with status $?"
pids=("${pids[@]:2}")
echo; echo "demo complete: logs are in $DEMO/logs"
step "what to try next"
cat <<NEXT
  $KONNECT init --dir $DEMO --control-plane-address 127.0.0.1 --apiserver-url https://127.0.0.1:6443 --agent-auth mtls --key-algorithm ecdsa-p256 --mode http-connect --dry-run
      what a change of --mode would rewrite, as a diff (the run above is kept byte for byte otherwise)
  less $DEMO/manifests/konnectivity-server.yaml $DEMO/konnectivity-agent/konnectivity-agent.yaml
      the server's static pod and the agents' DaemonSet, as a node would run them
  $KONNECT certs renew konnectivity-server --dir $DEMO
      re-sign a certificate with its key; it says what must restart
  README.md, "Control-plane setup": the same on a real node, with kube-apiserver's static pod patched
  README.md, "Developers": konnect socks and konnect proxy, to reach a remote API server over SSH
  make test (as root): a real kube-apiserver, etcd, kubelets and containerd, with konnect from its own image
NEXT
