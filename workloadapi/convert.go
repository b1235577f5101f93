package workloadapi

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

// spiffeIdentity returns the SPIFFE ID of a certificate secret and its
// trust domain. A certificate of another kind of identity (Linkerd's DNS
// names) cannot be an X.509-SVID: the caller is not entitled to one, and
// PermissionDenied, the SPIFFE Workload Endpoint standard's code for that,
// says why.
func spiffeIdentity(cert *secretmanager.Secret) (spiffeid.ID, spiffeid.TrustDomain, error) {
	if cert.Identity.SPIFFEID == "" {
		return spiffeid.ID{}, spiffeid.TrustDomain{}, status.Errorf(codes.PermissionDenied,
			"the Workload API serves SPIFFE identities; this workload's identity %q is not a SPIFFE ID (Linkerd identities are DNS names)",
			cert.Identity.String())
	}
	id, err := spiffeid.FromString(cert.Identity.SPIFFEID)
	if err != nil {
		return spiffeid.ID{}, spiffeid.TrustDomain{}, status.Errorf(codes.PermissionDenied,
			"the workload's identity %q is not a valid SPIFFE ID: %v", cert.Identity.SPIFFEID, err)
	}
	return id, id.TrustDomain(), nil
}

// svidResponse is the X.509-SVID of cert with the bundle roots: the chain
// and the bundle as concatenated DER certificates, the key as PKCS#8 DER.
func svidResponse(cert, roots *secretmanager.Secret) (*workload.X509SVIDResponse, error) {
	id, _, err := spiffeIdentity(cert)
	if err != nil {
		return nil, err
	}
	chain, err := pki.ParseCertificates(cert.CertChain)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "certificate chain of %s: %v", id, err)
	}
	key, err := keyDER(cert.PrivateKey)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "private key of %s: %v", id, err)
	}
	bundle, err := bundleDER(roots)
	if err != nil {
		return nil, err
	}
	return &workload.X509SVIDResponse{Svids: []*workload.X509SVID{{
		SpiffeId:    id.String(),
		X509Svid:    concatDER(chain),
		X509SvidKey: key,
		Bundle:      bundle,
	}}}, nil
}

// bundlesResponse is the bundle of td, keyed by the trust domain's SPIFFE
// ID as the standard asks.
func bundlesResponse(td spiffeid.TrustDomain, roots *secretmanager.Secret) (*workload.X509BundlesResponse, error) {
	bundle, err := bundleDER(roots)
	if err != nil {
		return nil, err
	}
	return &workload.X509BundlesResponse{Bundles: map[string][]byte{td.IDString(): bundle}}, nil
}

// bundleDER is the trust bundle of a root secret as concatenated DER, from
// its parsed Bundle (never re-parsed from PEM here).
func bundleDER(roots *secretmanager.Secret) ([]byte, error) {
	certs := roots.Bundle.Certs()
	if len(certs) == 0 {
		return nil, status.Error(codes.Internal, "trust bundle: no parsed roots")
	}
	return concatDER(certs), nil
}

// concatDER is the DER encodings of certs, concatenated.
func concatDER(certs []*x509.Certificate) []byte {
	n := 0
	for _, c := range certs {
		n += len(c.Raw)
	}
	out := make([]byte, 0, n)
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}

// keyDER returns the DER of a PKCS#8 PEM key.
func keyDER(pemKey []byte) ([]byte, error) {
	block, _ := pem.Decode(pemKey)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("not a PKCS#8 PEM key")
	}
	return block.Bytes, nil
}
