package linkerd

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	// ErrNotDNSIdentity is returned by Sign for an identity that is not a
	// DNS-like name: the Linkerd protocol has no SPIFFE IDs.
	ErrNotDNSIdentity = errors.New("linkerd identity must be a DNS name")
	// ErrMalformedAnswer is wrapped by Sign when the identity service answered
	// something that is not a DER leaf and DER intermediates.
	ErrMalformedAnswer = errors.New("malformed certify answer")
	// ErrClosed is returned by Sign after Close.
	ErrClosed = errors.New("linkerd identity client is closed")
)

// Retryable reports whether Sign failed for a reason that may pass by itself
// (the issuer is not ready, the service is unreachable or overloaded, the call
// timed out), so the caller may try again soon. Errors the identity service
// gave for this request itself (InvalidArgument for a bad token or request,
// FailedPrecondition for a CSR or identity it will not sign) are not: the
// same request would fail the same way. A refusal to send the token to an
// unverified peer, a token that cannot be read and a malformed answer are not
// retryable either.
//
// The gRPC status stays in the error chain, so status.Code(err) also works on
// the errors Sign returns.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := status.FromError(err); !ok {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal:
		return true
	}
	return false
}
