// Package pki creates, validates, renews and reports on the certificates that the Kubernetes aggregation
// layer and the Konnectivity tunnel need on a control-plane node, and writes the Konnectivity server's
// kubeconfig.
//
// One table of certificate specs (Specs) drives everything: the files on disk, the
// `konnect init phase certs NAME` subcommands and their help text, the checks run on existing files,
// `konnect certs check-expiration` and `konnect certs renew`.
//
// Files, relative to the konnect directory DIR (default /etc/kubernetes):
//
//	DIR/pki/ca.{crt,key}                          cluster CA (kept if present; external when only ca.crt exists)
//	DIR/pki/front-proxy-ca.{crt,key}              aggregation-layer client CA (--requestheader-client-ca-file)
//	DIR/pki/front-proxy-client.{crt,key}          kube-apiserver's client cert towards extension API servers
//	DIR/pki/konnectivity-server-client.{crt,key}  Konnectivity server's client cert towards kube-apiserver
//	DIR/pki/konnectivity-server.{crt,key}         agent-facing serving cert of the Konnectivity server
//	DIR/pki/konnectivity-agent.{crt,key}          agent client cert (only with mTLS agent authentication)
//	DIR/pki/konnectivity-frontend.{crt,key}       kube-apiserver-facing serving cert (only HTTPConnect over TCP)
//	DIR/pki/apiserver-egress-client.{crt,key}     kube-apiserver's client cert for that frontend (same condition)
//	DIR/konnectivity-server.conf                  kubeconfig of the Konnectivity server
//
// Generation is idempotent: a CA is never overwritten, an existing leaf is loaded, checked and kept, and a
// second identical run changes no byte. Keys are written before certificates, every file atomically, so an
// interrupted run never leaves a certificate whose key is lost.
//
// The package does not render Kubernetes manifests, kube-apiserver flags or the egress selector
// configuration, and it does not talk to a cluster.
package pki
