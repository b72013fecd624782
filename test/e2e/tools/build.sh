#!/usr/bin/env bash
# Prepares everything the end-to-end tests run against:
#   - checks that we are root and that `ip netns` works (the tests need both);
#   - installs the Debian packages (hack/install-deps.sh) when a program is missing;
#   - builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
#     and kubeadm v1.36.1, etcd v3.6.8 (the version kubeadm 1.36 deploys),
#     sample-apiserver v0.36.1 and upstream proxy-server/proxy-agent v0.36.0
#     from this tools module into the cache dir.
#
# A build is skipped when the cache holds binaries made from the same go.mod,
# go.sum and Go version. The cache dir is $KONNECT_E2E_CACHE, or
# test/e2e/.cache by default; binaries go to its bin/ subdirectory.
#
# Usage: bash test/e2e/tools/build.sh   (prints the bin dir on the last line)
set -euo pipefail

tools_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_dir="${KONNECT_E2E_CACHE:-${tools_dir}/../.cache}"
mkdir -p "${cache_dir}"
cache_dir="$(cd "${cache_dir}" && pwd)"
bin_dir="${cache_dir}/bin"

log() { printf 'e2e-tools: %s\n' "$*" >&2; }
die() { printf 'e2e-tools: FATAL: %s\n' "$*" >&2; exit 1; }

# --- Requirements that cannot be installed ----------------------------------
if [[ "$(id -u)" != 0 ]]; then
	die "the end-to-end tests need root (network namespaces, veth pairs, sshd); run as root"
fi
command -v ip >/dev/null 2>&1 || need_iproute=1
if [[ -z "${need_iproute:-}" ]]; then
	probe="kn-probe-$$"
	if ! ip netns add "${probe}" 2>/dev/null; then
		die "'ip netns add' does not work here; the end-to-end tests need network namespaces (root with CAP_SYS_ADMIN, /run/netns writable)"
	fi
	ip netns del "${probe}"
fi

# --- Debian packages: one list, in hack/install-deps.sh ------------------------
bash "${tools_dir}/../../../hack/install-deps.sh" >&2
if [[ -n "${need_iproute:-}" ]]; then
	probe="kn-probe-$$"
	ip netns add "${probe}" 2>/dev/null || die "'ip netns add' does not work here; the end-to-end tests need network namespaces"
	ip netns del "${probe}"
fi
command -v kubectl >/dev/null 2>&1 || die "kubectl is not installed (expected /usr/bin/kubectl)"

# --- Go binaries -----------------------------------------------------------
export GOTOOLCHAIN=local
# Static binaries: sample-apiserver and the upstream proxy-server/proxy-agent also run in scratch images.
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
go_version="$(go env GOVERSION)"
key="$(cat "${tools_dir}/go.mod" "${tools_dir}/go.sum" "${BASH_SOURCE[0]}" "${tools_dir}"/pizza-webhook/*.go | sha256sum | cut -c1-16)-${go_version}"
stamp="${bin_dir}/.stamp"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubeadm etcd sample-apiserver proxy-server proxy-agent pizza-webhook)

# One build at a time: the benchmarks and the tests may both call this script.
exec 9>"${cache_dir}/.lock"
flock 9

have_all=1
for b in "${binaries[@]}"; do [[ -x "${bin_dir}/${b}" ]] || have_all=0; done
if [[ "${have_all}" == 1 && -f "${stamp}" && "$(cat "${stamp}")" == "${key}" ]]; then
	log "cache hit (${key}) in ${bin_dir}"
	echo "${bin_dir}"
	exit 0
fi

log "building tools into ${bin_dir} (key ${key}); the first build of kube-apiserver takes several minutes"
mkdir -p "${bin_dir}"
rm -f "${stamp}"
kube_version=v1.36.1
vpkg=k8s.io/component-base/version
kube_ldflags="-s -w -X ${vpkg}.gitVersion=${kube_version} -X ${vpkg}.gitMajor=1 -X ${vpkg}.gitMinor=36 -X ${vpkg}.gitTreeState=clean -X ${vpkg}.buildDate=2026-01-01T00:00:00Z"

build() { # OUT PKG LDFLAGS
	local out="$1" pkg="$2" ldflags="$3" start=${SECONDS}
	log "go build ${pkg} -> ${out}"
	(cd "${tools_dir}" && nice -n 10 go build -trimpath -ldflags "${ldflags}" -o "${bin_dir}/${out}.tmp" "${pkg}")
	mv -f "${bin_dir}/${out}.tmp" "${bin_dir}/${out}"
	log "built ${out} in $((SECONDS - start))s"
}
total_start=${SECONDS}
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "${kube_ldflags}"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "${kube_ldflags}"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "${kube_ldflags}"
build kubelet k8s.io/kubernetes/cmd/kubelet "${kube_ldflags}"
build kubeadm k8s.io/kubernetes/cmd/kubeadm "${kube_ldflags}"
# etcd for kubeadm's static pod: static (CGO_ENABLED=0, as everything here) so that it runs in a scratch
# image; Debian's etcd-server is dynamically linked and older (3.4) than the 3.6 kubeadm 1.36 expects.
build etcd go.etcd.io/etcd/server/v3 "-s -w"
# sample-apiserver reports the same version so its discovery and skew checks look normal.
build sample-apiserver k8s.io/sample-apiserver "${kube_ldflags}"
build proxy-server sigs.k8s.io/apiserver-network-proxy/cmd/server "-s -w"
build proxy-agent sigs.k8s.io/apiserver-network-proxy/cmd/agent "-s -w"
build pizza-webhook ./pizza-webhook "-s -w"
echo "${key}" >"${stamp}"
log "all tools built in $((SECONDS - total_start))s"
echo "${bin_dir}"
