package daemon

import (
	"fmt"
	"strings"

	"k8s.io/klog/v2"
)

// RedactSecretsInLogs installs a klog filter that keeps credentials out of the logs at every verbosity.
// client-go logs request and response bodies from -v=8 on, and a TokenReview's body is the agent's token;
// konnect's own code never logs keys or tokens, so this guards what libraries print. klog gives a filter
// every argument and every value of a key/value pair, but not the error of ErrorS, which it prints as it
// is: such errors come from TLS, gRPC and client-go, and carry no request body.
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

// redact returns v, or the redaction when v as it would be printed may hold a credential. Numbers and
// booleans cannot, and are not formatted; anything else (an error, a header map, a struct) is checked as
// klog prints it.
func redact(v interface{}) interface{} {
	var text string
	switch x := v.(type) {
	case nil, bool, int, int32, int64, uint, uint32, uint64, float64:
		return v
	case string:
		text = x
	case []byte:
		text = string(x)
	case error:
		text = x.Error()
	case fmt.Stringer:
		text = x.String()
	default:
		text = fmt.Sprintf("%+v", x)
	}
	if sensitive(text) {
		return redacted
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
