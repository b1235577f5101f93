package caclient

import (
	"context"
	"crypto/x509"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
)

// Client asks a CA to sign a certificate signing request.
type Client interface {
	// Sign sends a DER CSR for id with the requested lifetime and returns the
	// chain the CA answered, leaf first. It parses the answer but does not
	// judge it: the caller checks it with pki.VerifyIssued before use.
	Sign(ctx context.Context, csr []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error)
	// Close releases the connection. It is safe to call twice.
	Close() error
}

// Preconnecter is a Client that can open its connection to the CA before
// the first Sign, so the TCP and TLS handshakes overlap the caller's own
// start-up instead of delaying the first certificate.
type Preconnecter interface {
	// Preconnect starts connecting in the background and returns at once.
	// A failure is not reported here: the first Sign meets it and reports it.
	Preconnect()
}

// Permanent reports whether err is a CA's refusal for good: asking again
// with the same request cannot succeed (gRPC InvalidArgument,
// PermissionDenied, FailedPrecondition or Unimplemented).
func Permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition, codes.Unimplemented:
		return true
	}
	return false
}
