// Package egress holds no code: its subpackages are kube-apiserver's egress path at run time. tunnel is the
// Konnectivity server that kube-apiserver dials; konnectivity (with wire, flow and batchtls) is the protocol
// kit the server and the agent share; extensions checks the extension servers kube-apiserver reaches through
// it. What konnect writes for kube-apiserver (its EgressSelectorConfiguration, flags and static-pod patch) is
// manifests/kubeapiserver.
package egress
