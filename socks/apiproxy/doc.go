// Package apiproxy is konnect's drop-in for `kubectl proxy`: a local HTTP endpoint that forwards requests to
// a Kubernetes API server with the credentials of a kubeconfig, so that curl, browsers and scripts can reach
// the API without handling certificates or tokens.
//
// It keeps kubectl proxy's request filter (accepted Host headers, accepted and rejected paths, rejected
// methods), because its defaults are what stop a web page in the user's browser from reaching the cluster
// through the proxy (DNS rebinding, kubernetes issue 8871); its default rejected paths add the kubelet's
// exec, attach, run and portForward through the node proxy to kubectl's (see DefaultRejectPaths). It streams watches, passes protocol
// upgrades (exec, attach, port-forward over SPDY or WebSocket) when the filter allows them, honours the
// kubeconfig's proxy-url, and can instead carry its traffic over an injected dialer, such as an SSH
// connection.
//
// It builds its connections to the API server from client-go's own TLS and authentication pieces, so every
// credential client-go understands works, but by default it keeps a pool of HTTP/1.1 connections instead of
// one HTTP/2 connection: a Go HTTP/2 server such as kube-apiserver spends more CPU per request than an
// HTTP/1.1 one (about a quarter more, measured against a Go HTTPS backend), and the proxy no less.
//
// It is not a general reverse proxy and not an authenticating front end: anyone who can reach its listener
// acts with the kubeconfig's identity, which is why `konnect proxy` binds its listener on loopback unless
// told otherwise. Flag parsing, binding and process plumbing live in that command (cmd/internal/proxycmd).
package apiproxy
