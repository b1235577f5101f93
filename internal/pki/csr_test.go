package pki_test

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/internal/pki"
)

var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// sanExtension returns the only subjectAltName extension of a CSR.
func sanExtension(t *testing.T, csr *x509.CertificateRequest) (critical bool, names []asn1.RawValue) {
	t.Helper()
	found := 0
	for _, e := range csr.Extensions {
		if !e.Id.Equal(oidSAN) {
			continue
		}
		found++
		critical = e.Critical
		rest, err := asn1.Unmarshal(e.Value, &names)
		if err != nil || len(rest) != 0 {
			t.Fatalf("SAN extension does not parse: %v", err)
		}
	}
	if found != 1 {
		t.Fatalf("%d SAN extensions, want 1", found)
	}
	return critical, names
}

func TestNewCSRSPIFFE(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	der, err := pki.NewCSR(key, testID)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSR(der)
	if err != nil {
		t.Fatal(err)
	}
	critical, names := sanExtension(t, csr)
	if !critical {
		t.Error("SAN extension is not critical although the subject is empty")
	}
	if len(names) != 1 || names[0].Class != asn1.ClassContextSpecific || names[0].Tag != 6 || string(names[0].Bytes) != testID.SPIFFEID {
		t.Errorf("SAN names %+v, want exactly the URI %s", names, testID.SPIFFEID)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != testID.SPIFFEID {
		t.Errorf("URIs %v", csr.URIs)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) != 0 {
		t.Errorf("extra SANs: %v %v %v", csr.DNSNames, csr.IPAddresses, csr.EmailAddresses)
	}
	var subject asn1.RawValue
	if _, err := asn1.Unmarshal(csr.RawSubject, &subject); err != nil || len(subject.Bytes) != 0 {
		t.Errorf("subject is not empty: %v %x", err, subject.Bytes)
	}
	if !pki.PublicKeysEqual(key.Public(), csr.PublicKey) {
		t.Error("CSR carries another key")
	}
}

func TestNewCSRDNSName(t *testing.T) {
	t.Parallel()
	id := pki.LinkerdIdentity("cluster.local", "shop", "web", "linkerd")
	if id.DNSName != "web.shop.serviceaccount.identity.linkerd.cluster.local" {
		t.Fatalf("identity %q", id.DNSName)
	}
	der, err := pki.NewCSR(newKey(t), id)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSR(pki.EncodeCSRPEM(der))
	if err != nil {
		t.Fatal(err)
	}
	critical, names := sanExtension(t, csr)
	if !critical || len(names) != 1 || names[0].Tag != 2 || string(names[0].Bytes) != id.DNSName {
		t.Errorf("critical %v names %+v", critical, names)
	}
	if len(csr.DNSNames) != 1 || len(csr.URIs) != 0 || csr.Subject.CommonName != "" {
		t.Errorf("DNS %v URIs %v CN %q", csr.DNSNames, csr.URIs, csr.Subject.CommonName)
	}
}

func TestNewCSRRejectsBadIdentity(t *testing.T) {
	t.Parallel()
	for _, id := range []pki.Identity{{}, {SPIFFEID: "http://x/y"}, {SPIFFEID: "spiffe://a/b", DNSName: "c"}, {DNSName: "a b"}} {
		if _, err := pki.NewCSR(newKey(t), id); err == nil {
			t.Errorf("%+v accepted", id)
		}
	}
}

func TestParseCSRRejects(t *testing.T) {
	t.Parallel()
	der, err := pki.NewCSR(newKey(t), testID)
	if err != nil {
		t.Fatal(err)
	}
	tampered := append([]byte{}, der...)
	tampered[len(tampered)-3] ^= 0xff // inside the signature
	tests := map[string]struct {
		data []byte
		want string
	}{
		"garbage":     {[]byte("garbage"), "parsing CSR"},
		"wrong block": {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), `"CERTIFICATE", want CERTIFICATE REQUEST`},
		"bad sig":     {tampered, "CSR signature"},
		"truncated":   {der[:len(der)-10], "parsing CSR"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := pki.ParseCSR(tt.data); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := pki.ParseCSR(pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: der})); err != nil {
		t.Errorf("legacy block type: %v", err)
	}
}
