// Package pki creates, validates, renews and reports on the certificates that the Kubernetes aggregation
// layer and the Konnectivity tunnel need on a control-plane node, and writes the Konnectivity server's
// kubeconfig.
//
// One table of certificate specs (Specs) drives everything: the files on disk, the
// `konnect init phase certs NAME` subcommands and their help text, the checks run on existing files,
// `konnect certs check-expiration`, `konnect certs renew` and the steps it prints after a renewal (Feeds).
//
// Files, relative to the konnect directory DIR (default /etc/kubernetes): DIR/pki/BASENAME.{crt,key} for
// each row of Specs that the Config calls for (`konnect init --help` lists them), and
// DIR/konnectivity-server.conf, the Konnectivity server's kubeconfig.
//
// Generation is idempotent: a CA is never overwritten, an existing leaf is loaded, checked and kept, and a
// second identical run changes no byte. Keys are written before certificates, every file atomically, so an
// interrupted run never leaves a certificate whose key is lost.
//
// The package does not render Kubernetes manifests, kube-apiserver flags or the egress selector
// configuration, and it does not talk to a cluster.
package pki
