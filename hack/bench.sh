#!/usr/bin/env bash
# make bench: konnect against its peers on one network-namespace topology, in one run (see test/bench).
# The upstream proxy-server/proxy-agent come from the e2e tools build (test/e2e/tools/build.sh), OpenSSH
# and hey from Debian, kubectl from /usr/bin/kubectl. konnect is the static binary of the image (make static),
# built with the same flags as those upstream binaries. Writes docs/benchmarks.md and docs/benchmarks.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
tools_bin=$(bash test/e2e/tools/build.sh | tail -n 1)
mkdir -p .cache/bench
go build -o .cache/bench/loadgen ./test/bench/loadgen
go build -o .cache/bench/backend ./test/bench/backend
go build -o .cache/bench/swarm ./test/bench/swarm
go build -o .cache/bench/relay ./test/bench/relay
go build -o .cache/bench/bench ./test/bench
exec .cache/bench/bench --konnect bin/image/konnect \
	--proxy-server "$tools_bin/proxy-server" --proxy-agent "$tools_bin/proxy-agent" \
	--kube-apiserver "$tools_bin/kube-apiserver" \
	--loadgen .cache/bench/loadgen --backend .cache/bench/backend --relay .cache/bench/relay --swarm .cache/bench/swarm "$@"
