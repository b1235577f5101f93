package istio

import (
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/istioca"
)

// One identity's refusal must not cancel another identity's request in
// flight on the same connection: a slow CSR the CA is about to answer
// succeeds while another is refused with PermissionDenied (before, the
// refusal retired the shared connection and the slow call ended Canceled).
func TestRefusalLeavesAnotherCallInFlight(t *testing.T) {
	e := newEnv(t, istioca.Config{}, nil)
	id := e.ca.Identity(appSA)
	slowKey, slowCSR := newCSR(t, id)
	_, refusedCSR := newCSR(t, id)
	if _, err := e.client.Sign(ctxT(t), slowCSR, id, time.Hour); err != nil {
		t.Fatalf("first Sign: %v", err)
	}

	arrived, release := e.ca.HoldNext()
	defer release()
	type result struct {
		chain []*x509.Certificate
		err   error
	}
	slow := make(chan result, 1)
	go func() {
		chain, err := e.client.Sign(ctxT(t), slowCSR, id, time.Hour)
		slow <- result{chain, err}
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow CSR never reached the CA")
	}

	e.ca.FailNext(1, codes.PermissionDenied)
	if _, err := e.client.Sign(ctxT(t), refusedCSR, id, time.Hour); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refused Sign: %v, want PermissionDenied", err)
	}
	release()
	r := <-slow
	if r.err != nil {
		t.Fatalf("the slow CSR beside a refused one: %v, want a certificate", r.err)
	}
	if err := pki.VerifyIssued(r.chain, slowKey.Public(), id, e.ca.Roots(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := e.ca.Requests(); got != 3 {
		t.Errorf("the CA saw %d requests, want 3 (nothing retried)", got)
	}
}
