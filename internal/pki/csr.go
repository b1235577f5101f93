package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
)

// oidSubjectAltName is id-ce-subjectAltName (RFC 5280 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// General name tags (RFC 5280 GeneralName).
const (
	tagDNSName = 2
	tagURI     = 6
)

// NewCSR makes a DER certificate signing request for id, signed by key. The
// subject is empty and the identity is the only subject alternative name, in
// an extension marked critical as RFC 5280 requires for an empty subject (some
// CAs reject the request otherwise).
func NewCSR(key crypto.Signer, id Identity) ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	san, err := marshalSAN(id)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{
		ExtraExtensions: []pkix.Extension{{Id: oidSubjectAltName, Critical: true, Value: san}},
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("creating CSR for %s: %w", id, err)
	}
	return der, nil
}

// EncodeCSRPEM wraps a DER CSR in a "CERTIFICATE REQUEST" PEM block.
func EncodeCSRPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// ParseCSR parses a CSR in PEM or DER form and checks its signature.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	der := data
	if block, _ := pem.Decode(data); block != nil {
		if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
			return nil, fmt.Errorf("PEM block type %q, want CERTIFICATE REQUEST", block.Type)
		}
		der = block.Bytes
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	return csr, nil
}

func marshalSAN(id Identity) ([]byte, error) {
	var raw asn1.RawValue
	if id.SPIFFEID != "" {
		raw = asn1.RawValue{Tag: tagURI, Class: asn1.ClassContextSpecific, Bytes: []byte(id.SPIFFEID)}
	} else {
		raw = asn1.RawValue{Tag: tagDNSName, Class: asn1.ClassContextSpecific, Bytes: []byte(id.DNSName)}
	}
	b, err := asn1.Marshal([]asn1.RawValue{raw})
	if err != nil {
		return nil, fmt.Errorf("encoding subject alternative name: %w", err)
	}
	return b, nil
}
