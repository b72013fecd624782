// Package egress is kube-apiserver's side of the egress path on a control-plane node: it renders the
// EgressSelectorConfiguration that points kube-apiserver's "cluster" traffic at the Konnectivity server,
// computes the kube-apiserver flags that the aggregation layer and the tunnel need, and patches an
// existing kube-apiserver static pod manifest (as kubeadm writes it) to carry those flags and mounts.
//
// What kube-apiserver accepts decides what this package renders:
//
//	--mode grpc         --transport uds   GRPC over a unix socket (the default and recommended pairing)
//	--mode http-connect --transport uds   HTTP CONNECT over a unix socket
//	--mode http-connect --transport tcp   HTTP CONNECT over TCP with mutual TLS
//	--mode grpc         --transport tcp   refused: kube-apiserver only speaks GRPC over a unix socket
//
// The package does not run the tunnel (that is egress/tunnel), create certificates (pki) or render the
// Konnectivity server and agent manifests (manifests). It never talks to a cluster.
package egress
