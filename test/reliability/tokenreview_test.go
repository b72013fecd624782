//go:build integration

package reliability

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/konnect-dev/konnect/pki/pkitest"
	authnv1 "k8s.io/api/authentication/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Identity the fake TokenReview accepts, as konnect server is configured with it.
const (
	agentNamespace = "kube-system"
	agentSA        = "konnectivity-agent"
	agentAudience  = "system:konnectivity-server"
)

// fakeToken is a token the fake TokenReview knows.
type fakeToken struct {
	user      string
	audiences []string
	expired   bool
}

// tokenReviewer is a small stand-in for kube-apiserver's TokenReview API: the server under test sends it
// the agents' tokens. The real kube-apiserver path is covered by the end-to-end suite.
type tokenReviewer struct {
	srv    *httptest.Server
	mu     sync.Mutex
	tokens map[string]fakeToken
	paths  map[string]int // requests other than TokenReviews, by path
}

func newTokenReviewer(t *testing.T) *tokenReviewer {
	tr := &tokenReviewer{tokens: map[string]fakeToken{}, paths: map[string]int{}}
	tr.srv = httptest.NewTLSServer(http.HandlerFunc(tr.serve))
	t.Cleanup(tr.srv.Close)
	return tr
}

// requests reports how many requests for path reached the stand-in API server.
func (tr *tokenReviewer) requests(path string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.paths[path]
}

func (tr *tokenReviewer) add(token string, ft fakeToken) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.tokens[token] = ft
}

func (tr *tokenReviewer) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/tokenreviews") || r.Method != http.MethodPost {
		tr.mu.Lock()
		tr.paths[r.URL.Path]++
		tr.mu.Unlock()
		if r.URL.Path == "/version" {
			_ = json.NewEncoder(w).Encode(map[string]string{"major": "1", "minor": "36", "gitVersion": "v1.36.1"})
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
		return
	}
	var review authnv1.TokenReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tr.mu.Lock()
	ft, ok := tr.tokens[review.Spec.Token]
	tr.mu.Unlock()
	review.APIVersion, review.Kind = "authentication.k8s.io/v1", "TokenReview"
	var aud []string
	for _, a := range review.Spec.Audiences {
		if slices.Contains(ft.audiences, a) {
			aud = append(aud, a)
		}
	}
	switch {
	case !ok:
		review.Status.Error = "invalid bearer token"
	case ft.expired:
		review.Status.Error = "invalid bearer token, token has expired"
	case len(review.Spec.Audiences) > 0 && len(aud) == 0:
		review.Status.Error = "invalid bearer token, token audiences " + strings.Join(ft.audiences, ",") + " is invalid for the target audiences " + strings.Join(review.Spec.Audiences, ",")
	default:
		review.Status.Authenticated = true
		review.Status.Audiences = aud
		review.Status.User = authnv1.UserInfo{Username: ft.user, UID: "uid-" + ft.user}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// kubeconfig writes a kubeconfig for konnect server that points at the fake, trusting its certificate.
func (tr *tokenReviewer) kubeconfig(t *testing.T, dir string) string {
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tr.srv.Certificate().Raw})
	path := filepath.Join(dir, "tokenreview.kubeconfig")
	err := pkitest.WriteKubeconfig(path, clientcmdapi.Cluster{Server: tr.srv.URL, CertificateAuthorityData: caPEM},
		clientcmdapi.AuthInfo{Token: "konnectivity-server-token-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// tokenServerArgs are the flags that make konnect server authenticate agents by token against tr.
func tokenServerArgs(kubeconfig string) []string {
	return []string{"--kubeconfig", kubeconfig, "--agent-namespace", agentNamespace,
		"--agent-service-account", agentSA, "--authentication-audience", agentAudience,
		// The fake speaks JSON only.
		"--kube-api-content-type", "application/json"}
}

// goodAgentToken registers and returns a valid agent token.
func (tr *tokenReviewer) goodAgentToken() string {
	tok := "agent-token-" + time.Now().Format("150405.000000000")
	tr.add(tok, fakeToken{user: "system:serviceaccount:" + agentNamespace + ":" + agentSA, audiences: []string{agentAudience}})
	return tok
}
