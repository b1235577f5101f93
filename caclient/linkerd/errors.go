package linkerd

import "errors"

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
