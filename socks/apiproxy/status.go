package apiproxy

import (
	"encoding/json"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// statusBody is the body of every answer the proxy gives itself (a refused request, a hop that failed): a
// metav1.Status in JSON, as kube-apiserver answers its own errors. kubectl (client-go) prints a Status's
// message whatever the code, but of a plain-text body only for a 500 or 502: for a 503 or 400 it prints
// a generic sentence instead ("the server is currently unable to handle the request"), and the user never
// learns that the SSH server, not the API server, is down. The reason is client-go's own for the code. The
// JSON is indented, as kube-apiserver indents it for curl, so that curl users read it as easily.
func statusBody(code int, message string) []byte {
	reason := apierrors.NewGenericServerResponse(code, "", schema.GroupResource{}, "", "", 0, false).ErrStatus.Reason
	b, err := json.MarshalIndent(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   reason,
		Code:     int32(code),
	}, "", "  ")
	if err != nil { // a Status of strings and numbers always encodes
		panic(err)
	}
	return append(b, '\n')
}

// writeStatus answers the request with code and a Status that says message; see statusBody.
func writeStatus(w http.ResponseWriter, code int, message string) {
	body := statusBody(code, message)
	h := w.Header()
	h.Del("Content-Length") // as http.Error does: headers set for another answer do not apply
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
