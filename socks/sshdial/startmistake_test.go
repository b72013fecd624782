package sshdial

import (
	"net"
	"os"
	"strings"
	"testing"
)

// A name that does not resolve before any connection was up is a start-up mistake too (checked without
// sending a query anywhere).
func TestStartMistakeUnknownHost(t *testing.T) {
	d := &Dialer{plan: &plan{hops: []endpoint{{hostName: "bastion.invalid", port: 22, user: "u"}}}}
	notFound := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "bastion.invalid", IsNotFound: true}}
	if err := d.startMistake(notFound); err == nil || !strings.Contains(err.Error(), "RetryFirst") {
		t.Fatalf("startMistake(no such host) = %v, want a StartError", err)
	}
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	if err := d.startMistake(timeout); err != nil {
		t.Fatalf("startMistake(timeout) = %v, want nil: a server that does not answer yet may come", err)
	}
	d.plan.retryFirst = true
	if err := d.startMistake(notFound); err != nil {
		t.Fatalf("startMistake with RetryFirst = %v, want nil", err)
	}
}
