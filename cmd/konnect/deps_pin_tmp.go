package main

// Temporary: keeps every chosen dependency in go.mod while the packages that use them are written.
import (
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/kevinburke/ssh_config"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "go.uber.org/goleak"
	_ "golang.org/x/crypto/ssh"
	_ "golang.org/x/crypto/ssh/agent"
	_ "golang.org/x/crypto/ssh/knownhosts"
	_ "golang.org/x/net/proxy"
	_ "golang.org/x/term"
	_ "google.golang.org/grpc"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/runtime"
	_ "k8s.io/apiserver/pkg/apis/apiserver/install"
	_ "k8s.io/apiserver/pkg/server/egressselector"
	_ "k8s.io/apiserver/pkg/server/healthz"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/component-base/version"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kubectl/pkg/proxy"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent/app"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server/app"
	_ "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	_ "sigs.k8s.io/apiserver-network-proxy/pkg/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/pkg/server"
	_ "sigs.k8s.io/yaml"
)

