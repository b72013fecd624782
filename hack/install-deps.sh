#!/usr/bin/env bash
# Installs the Debian packages that konnect's tests, benchmarks and demo use, when any is missing.
# A fresh machine has only Go; CI runs this as root.
set -euo pipefail
need=()
command -v etcd >/dev/null          || need+=(etcd-server)
[ -x /usr/sbin/sshd ]               || need+=(openssh-server)
command -v ssh >/dev/null           || need+=(openssh-client)
command -v hey >/dev/null           || need+=(hey)
command -v curl >/dev/null          || need+=(curl)
command -v openssl >/dev/null       || need+=(openssl)
command -v ip >/dev/null            || need+=(iproute2)
command -v flock >/dev/null         || need+=(util-linux)
# Real nodes in the end-to-end suite: containerd (with ctr), runc, the CNI plugins, iptables for the workers'
# masquerade rule, and busybox for the workload image's shell and tar.
command -v containerd >/dev/null    || need+=(containerd)
command -v runc >/dev/null          || need+=(runc)
[ -x /usr/lib/cni/bridge ]          || need+=(containernetworking-plugins)
command -v iptables >/dev/null      || need+=(iptables)
# TestKubeadm: the load balancer in front of the three kube-apiservers and Konnectivity servers.
[ -x /usr/sbin/haproxy ]            || need+=(haproxy)
[ -x /bin/busybox ]                 || need+=(busybox-static)
# make image-multiarch's test runs the linux/arm64 binary under qemu-user (statically linked, no binfmt needed).
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
# go test -race needs cgo, and cgo a C compiler with the C library headers.
command -v gcc >/dev/null           || need+=(gcc libc6-dev)
# kubectl comes with the base image (/usr/bin/kubectl); Debian's own kubernetes-client is far too old to stand in.
command -v kubectl >/dev/null || { echo "install-deps: kubectl not found at /usr/bin/kubectl" >&2; exit 1; }
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: missing ${need[*]}; run as root (or install them) first" >&2
	exit 1
fi
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts the services it installs; the tests run their own instances on their own ports.
for svc in etcd ssh containerd; do systemctl disable --now "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true; done
