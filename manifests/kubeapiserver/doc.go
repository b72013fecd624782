// Package kubeapiserver is what konnect writes for kube-apiserver on a control-plane node: it renders the
// EgressSelectorConfiguration that points kube-apiserver's "cluster" traffic at the Konnectivity server,
// computes the kube-apiserver flags that the aggregation layer and the tunnel need, patches an existing
// kube-apiserver static pod manifest (as kubeadm writes it) to carry those flags and mounts, and records the
// same flags and mounts in kubeadm's ClusterConfiguration, so that kubeadm upgrade and join keep them.
//
// What kube-apiserver accepts decides what this package renders:
//
//	--mode grpc         --transport uds   GRPC over a unix socket (the default and recommended pairing)
//	--mode http-connect --transport uds   HTTP CONNECT over a unix socket
//	--mode http-connect --transport tcp   HTTP CONNECT over TCP with mutual TLS
//	--mode grpc         --transport tcp   refused: kube-apiserver only speaks GRPC over a unix socket
//
// The package does not run the tunnel (that is egress/tunnel), create certificates (pki) or render the
// Konnectivity server and agent manifests (manifests). It edits the kubeadm ClusterConfiguration given to
// it, and talks to no cluster.
package kubeapiserver
