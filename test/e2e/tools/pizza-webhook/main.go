// Command pizza-webhook is the extension server of konnect's end-to-end tests for webhooks: a validating
// admission webhook and a CRD conversion webhook for the Pizza resource of seed 003
// (restaurant.example.com, v1alpha1 toppings as a list of names, v1beta1 as names with quantities).
//
// It uses the real admission/v1 AdmissionReview and apiextensions/v1 ConversionReview types, and reloads
// its serving certificate when the files change (a Secret volume is updated by an atomic symlink swap),
// so that a CA rotation needs no restart.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const group = "restaurant.example.com"

// forbidden is the topping the validating webhook refuses, with its own message.
const forbidden = "pineapple"

func main() {
	addr := flag.String("listen", ":8443", "address to serve HTTPS on")
	certFile := flag.String("tls-cert-file", "/etc/webhook/tls.crt", "serving certificate")
	keyFile := flag.String("tls-private-key-file", "/etc/webhook/tls.key", "serving key")
	flag.Parse()

	certs := &reloader{certFile: *certFile, keyFile: *keyFile}
	if _, err := certs.get(); err != nil {
		log.Fatalf("serving certificate: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/validate", serveReview(validate))
	mux.HandleFunc("/convert", serveConversion)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := &http.Server{
		Addr:              *addr,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return certs.get() }},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("serving on %s", *addr)
	if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// reloader serves the certificate in two files, re-reading them at most once a second and switching to a
// new pair only when it is complete and valid.
type reloader struct {
	certFile, keyFile string
	mu                sync.Mutex
	checked           time.Time
	certPEM, keyPEM   []byte
	cert              *tls.Certificate
}

func (r *reloader) get() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && time.Since(r.checked) < time.Second {
		return r.cert, nil
	}
	r.checked = time.Now()
	certPEM, err1 := os.ReadFile(r.certFile)
	keyPEM, err2 := os.ReadFile(r.keyFile)
	if err := errors.Join(err1, err2); err != nil {
		if r.cert != nil {
			return r.cert, nil
		}
		return nil, err
	}
	if bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return r.cert, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if r.cert != nil { // a half-written update: keep serving the old pair
			return r.cert, nil
		}
		return nil, err
	}
	if r.cert != nil {
		log.Printf("reloaded the serving certificate from %s", r.certFile)
	}
	r.cert, r.certPEM, r.keyPEM = &pair, certPEM, keyPEM
	return r.cert, nil
}

func readJSON(w http.ResponseWriter, req *http.Request, into any) bool {
	if req.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return false
	}
	if err := json.NewDecoder(io.LimitReader(req.Body, 8<<20)).Decode(into); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func serveReview(admit func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var review admissionv1.AdmissionReview
		if !readJSON(w, req, &review) {
			return
		}
		if review.Request == nil {
			http.Error(w, "no request in the AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := admit(review.Request)
		resp.UID = review.Request.UID
		writeJSON(w, admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	}
}

// toppings reads the topping names of a Pizza in either version.
func toppings(raw []byte) ([]string, error) {
	var p struct {
		Spec struct {
			Toppings []json.RawMessage `json:"toppings"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	var names []string
	for _, t := range p.Spec.Toppings {
		var name string
		if json.Unmarshal(t, &name) != nil {
			var named struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(t, &named); err != nil {
				return nil, err
			}
			name = named.Name
		}
		names = append(names, name)
	}
	return names, nil
}

func validate(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	names, err := toppings(req.Object.Raw)
	if err != nil {
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Message: "cannot read the pizza: " + err.Error(), Code: http.StatusBadRequest}}
	}
	for _, n := range names {
		if n == forbidden {
			return &admissionv1.AdmissionResponse{Result: &metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
				Message: fmt.Sprintf("pizza-webhook: %s does not belong on a pizza", forbidden),
			}}
		}
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}

func serveConversion(w http.ResponseWriter, req *http.Request) {
	var review apiextensionsv1.ConversionReview
	if !readJSON(w, req, &review) {
		return
	}
	if review.Request == nil {
		http.Error(w, "no request in the ConversionReview", http.StatusBadRequest)
		return
	}
	resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, obj := range review.Request.Objects {
		out, err := convert(obj.Raw, review.Request.DesiredAPIVersion)
		if err != nil {
			resp.ConvertedObjects = nil
			resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
			break
		}
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: out})
	}
	writeJSON(w, apiextensionsv1.ConversionReview{TypeMeta: review.TypeMeta, Response: resp})
}

type topping struct {
	Name     string `json:"name"`
	Quantity int    `json:"quantity"`
}

// convert converts one Pizza between v1alpha1 (a repeated name is an extra portion) and v1beta1 (each
// name once, with a quantity), keeping every other field.
func convert(raw []byte, to string) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	from, _ := obj["apiVersion"].(string)
	obj["apiVersion"] = to
	if from == to {
		return json.Marshal(obj)
	}
	spec, _ := obj["spec"].(map[string]any)
	if spec == nil {
		return json.Marshal(obj)
	}
	list, _ := spec["toppings"].([]any)
	switch {
	case from == group+"/v1alpha1" && to == group+"/v1beta1":
		var out []topping
		idx := map[string]int{}
		for _, t := range list {
			name, _ := t.(string)
			if i, ok := idx[name]; ok {
				out[i].Quantity++
				continue
			}
			idx[name] = len(out)
			out = append(out, topping{Name: name, Quantity: 1})
		}
		spec["toppings"] = out
	case from == group+"/v1beta1" && to == group+"/v1alpha1":
		var out []string
		for _, t := range list {
			m, _ := t.(map[string]any)
			name, _ := m["name"].(string)
			q, _ := m["quantity"].(float64)
			for i := 0; i < int(q); i++ {
				out = append(out, name)
			}
		}
		spec["toppings"] = out
	default:
		return nil, fmt.Errorf("cannot convert %s to %s", from, to)
	}
	return json.Marshal(obj)
}
