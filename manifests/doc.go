// Package manifests renders the Kubernetes manifests konnect writes: the konnectivity-server static pod,
// the konnectivity-agent DaemonSet with its ServiceAccount, RBAC (or, for agents that authenticate with a
// client certificate, the Secret holding it) and a kustomization.yaml, and the
// Secret, APIService and RBAC of an extension API server.
//
// Typed data goes in and YAML comes out: every object is built from the k8s.io/api types (a small local
// struct for APIService, whose types live in kube-aggregator) and marshalled with sigs.k8s.io/yaml, not
// filled into text templates. A misspelt field is then a compile error instead of a field the API server
// silently drops, and user input (image references, host names, PEM blocks) is always quoted correctly.
//
// The package renders. It does not write files (callers write File values atomically), create
// certificates, or talk to a cluster; it only moves and removes konnect's own files of an earlier agents'
// bundle (PrepareAgentBundle).
//
// The static pod belongs in kubelet's manifest directory; everything else is applied to the cluster with
// `kubectl apply -k DIR`. Keep the two in different directories: kubelet tries to run every file in its
// manifest directory as a pod.
package manifests
