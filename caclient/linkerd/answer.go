package linkerd

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/pki"
)

// validUntilTolerance is how far valid_until may be from the leaf's NotAfter
// before the answer is flagged. Linkerd sends the NotAfter itself; the leaf's
// NotAfter is what counts either way.
const validUntilTolerance = time.Minute

// parseAnswer turns a Certify answer into a chain, leaf first. It checks only
// the form (DER certificates that parse); the caller judges the content.
func parseAnswer(resp *identitypb.CertifyResponse) ([]*x509.Certificate, error) {
	if resp == nil || len(resp.GetLeafCertificate()) == 0 {
		return nil, fmt.Errorf("%w: no leaf certificate", ErrMalformedAnswer)
	}
	ders := make([][]byte, 0, 1+len(resp.GetIntermediateCertificates()))
	ders = append(ders, resp.GetLeafCertificate())
	for i, der := range resp.GetIntermediateCertificates() {
		if len(der) == 0 {
			return nil, fmt.Errorf("%w: intermediate %d is empty", ErrMalformedAnswer, i)
		}
		ders = append(ders, der)
	}
	chain, err := pki.ParseCertificatesDER(ders...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedAnswer, err)
	}
	return chain, nil
}

// checkValidUntil compares the answer's valid_until with the leaf's NotAfter.
// It returns a warning reason ("" when they agree) and the valid_until seen.
func checkValidUntil(resp *identitypb.CertifyResponse, leaf *x509.Certificate) (string, time.Time) {
	ts := resp.GetValidUntil()
	if ts == nil {
		return warnValidUntilMissing, time.Time{}
	}
	if err := ts.CheckValid(); err != nil {
		return warnValidUntilInvalid, time.Time{}
	}
	vu := ts.AsTime()
	d := vu.Sub(leaf.NotAfter)
	if d < -validUntilTolerance || d > validUntilTolerance {
		return warnValidUntilMismatch, vu
	}
	return "", vu
}
