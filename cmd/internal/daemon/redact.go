package daemon

import (
	"fmt"
	"strings"

	"k8s.io/klog/v2"
)

// RedactSecretsInLogs installs a klog filter that keeps credentials out of the logs at every verbosity.
// client-go logs request and response bodies from -v=8 on, and a TokenReview's body is the agent's token;
// konnect's own code never logs keys or tokens, so this guards what libraries print.
func RedactSecretsInLogs() { klog.SetLogFilter(secretFilter{}) }

type secretFilter struct{}

const redacted = "[redacted: may carry credentials]"

// sensitive reports whether a logged string may hold a credential: a PEM private key, a bearer token, or an
// API body with a token in it (TokenReview, TokenRequest, a Secret).
func sensitive(s string) bool {
	return strings.Contains(s, "PRIVATE KEY") ||
		strings.Contains(s, `"token"`) ||
		strings.Contains(s, "TokenReview") ||
		strings.Contains(s, `"kind":"Secret"`) ||
		strings.Contains(strings.ToLower(s), "bearer ") && !strings.Contains(s, "<masked>")
}

func redact(v interface{}) interface{} {
	switch x := v.(type) {
	case string:
		if sensitive(x) {
			return redacted
		}
	case []byte:
		if sensitive(string(x)) {
			return redacted
		}
	case fmt.Stringer:
		if sensitive(x.String()) {
			return redacted
		}
	}
	return v
}

func (secretFilter) Filter(args []interface{}) []interface{} {
	for i := range args {
		args[i] = redact(args[i])
	}
	return args
}

func (f secretFilter) FilterF(format string, args []interface{}) (string, []interface{}) {
	return format, f.Filter(args)
}

func (secretFilter) FilterS(msg string, kv []interface{}) (string, []interface{}) {
	for i := 1; i < len(kv); i += 2 {
		kv[i] = redact(kv[i])
	}
	return msg, kv
}
