package pki_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// FuzzParseCertificates: never a panic; what is accepted re-encodes to a
// bundle that parses to the same certificates.
func FuzzParseCertificates(f *testing.F) {
	ca := newCA(f, nowUTC())
	chain := issue(f, ca, localca.Leaf{PublicKey: newKey(f).Public(), Identity: testID})
	bundle := pki.EncodeCertificates(chain)
	f.Add(bundle)
	f.Add(ca.RootPEM())
	f.Add(bundle[:len(bundle)/2])
	f.Add(append(append([]byte{}, bundle...), "junk"...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := pki.ParseCertificates(data)
		if err != nil {
			if certs != nil {
				t.Fatal("certificates and an error")
			}
			return
		}
		if len(certs) == 0 {
			t.Fatal("no certificates and no error")
		}
		again, err := pki.ParseCertificates(pki.EncodeCertificates(certs))
		if err != nil || len(again) != len(certs) {
			t.Fatalf("re-encoded bundle: %v", err)
		}
		for i := range certs {
			if !again[i].Equal(certs[i]) {
				t.Fatalf("cert %d changed", i)
			}
		}
	})
}

// FuzzParseKeyPEM: never a panic; an accepted key encodes as PKCS#8 and
// parses back to the same public key.
func FuzzParseKeyPEM(f *testing.F) {
	k, err := pki.EncodeKeyPEM(newKey(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(k)
	f.Add(k[:len(k)-20])
	f.Add(bytes.Replace(k, []byte("PRIVATE KEY"), []byte("EC PRIVATE KEY"), 2))
	f.Add(bytes.Replace(k, []byte("PRIVATE KEY"), []byte("RSA PRIVATE KEY"), 2))
	f.Add(append(append([]byte{}, k...), k...))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		key, err := pki.ParseKeyPEM(data)
		if err != nil {
			return
		}
		out, err := pki.EncodeKeyPEM(key)
		if err != nil {
			t.Fatalf("accepted key does not encode: %v", err)
		}
		back, err := pki.ParseKeyPEM(out)
		if err != nil || !pki.PublicKeysEqual(key.Public(), back.Public()) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzParseCSR: never a panic; an accepted CSR has a valid signature.
func FuzzParseCSR(f *testing.F) {
	der, err := pki.NewCSR(newKey(f), testID)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(der)
	f.Add(pki.EncodeCSRPEM(der))
	f.Add(der[:len(der)/2])
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	f.Add([]byte{0x30, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := pki.ParseCSR(data)
		if err != nil {
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a CSR with a bad signature: %v", err)
		}
	})
}

// FuzzIdentityValidate: never a panic; a valid identity makes a CSR whose
// only SAN is exactly that identity, and a certificate for it passes the
// identity check of VerifyIssued.
func FuzzIdentityValidate(f *testing.F) {
	f.Add("spiffe://cluster.local/ns/a/sa/b", "")
	f.Add("", "web.shop.serviceaccount.identity.linkerd.cluster.local")
	f.Add("spiffe://td", "x")
	f.Add("spiffe://td/%41", "")
	f.Add("spiffe://TD/a", "")
	f.Add("", "a\x00b")
	f.Add("spiffe://td/a b", "")
	key := newKey(f)
	f.Fuzz(func(t *testing.T, spiffeID, dnsName string) {
		id := pki.Identity{SPIFFEID: spiffeID, DNSName: dnsName}
		if err := id.Validate(); err != nil {
			if _, err := pki.NewCSR(key, id); err == nil {
				t.Fatal("NewCSR accepted an invalid identity")
			}
			return
		}
		der, err := pki.NewCSR(key, id)
		if err != nil {
			// Valid by Validate yet not encodable (e.g. non-ASCII in an
			// IA5String): an error, not a panic, is all that is required.
			return
		}
		csr, err := x509.ParseCertificateRequest(der)
		if err != nil {
			// The x509 parser is stricter than Validate about URI syntax;
			// a CA rejects such a CSR the same way.
			return
		}
		critical, names := sanExtension(t, csr)
		want := id.String()
		if !critical || len(names) != 1 || string(names[0].Bytes) != want {
			t.Fatalf("SAN critical=%v names=%+v, want exactly %q", critical, names, want)
		}
		if tag := names[0].Tag; (id.SPIFFEID != "" && tag != 6) || (id.DNSName != "" && tag != 2) {
			t.Fatalf("SAN tag %d for %+v", tag, id)
		}
	})
}

// FuzzParseIdentity: caller identities come from outside the agent (a pod's
// service account, a setting). A parsed identity validates and prints back
// as given.
func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{"spiffe://cluster.local/ns/a/sa/b", "a.b.serviceaccount.identity.linkerd.cluster.local", "spiffe://", "spiffe://x/%41", "", " "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := pki.ParseIdentity(s)
		if err != nil {
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("ParseIdentity(%q) = %+v, which does not validate: %v", s, id, err)
		}
		if id.String() != s {
			t.Fatalf("ParseIdentity(%q).String() = %q", s, id.String())
		}
	})
}

// FuzzVerifyIssued: CA answers come from outside. Never a panic; an answer
// that is accepted is a workload certificate for the asked identity that
// chains to the roots: not a CA, no certificate or CRL signing, and the
// digitalSignature key usage.
func FuzzVerifyIssued(f *testing.F) {
	now := nowUTC()
	ca := newCA(f, now)
	key := newKey(f)
	good := issue(f, ca, localca.Leaf{PublicKey: key.Public(), Identity: testID})
	inter := good[1]
	f.Add(good[0].Raw)
	for _, edit := range []func(*x509.Certificate){
		func(c *x509.Certificate) { c.IsCA, c.BasicConstraintsValid = true, true },
		func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign },
		func(c *x509.Certificate) { c.KeyUsage = 0 },
		func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} },
	} {
		f.Add(issue(f, ca, localca.Leaf{PublicKey: key.Public(), Identity: testID, Edit: edit})[0].Raw)
	}
	f.Add(inter.Raw)
	f.Add([]byte{0x30, 0x00})
	roots := ca.Pool()
	f.Fuzz(func(t *testing.T, der []byte) {
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		if err := pki.VerifyIssued([]*x509.Certificate{leaf, inter}, leaf.PublicKey, testID, roots, now); err != nil {
			if pki.Reason(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if leaf.IsCA || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 || leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
			t.Fatalf("accepted a leaf that is not a workload certificate: IsCA=%v KeyUsage=%b", leaf.IsCA, leaf.KeyUsage)
		}
		if id, err := pki.IdentityOf(leaf); err != nil || id != testID {
			t.Fatalf("accepted a leaf for %v (%v)", id, err)
		}
	})
}

// FuzzWorkloadUsage: for every combination of basic constraints, key usage
// and extended key usage a CA could put in a leaf it signs correctly,
// VerifyIssued accepts exactly the workload certificates of docs/trust.md.
func FuzzWorkloadUsage(f *testing.F) {
	now := nowUTC()
	ca := newCA(f, now)
	key := newKey(f)
	f.Add(false, false, uint16(x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment), uint8(0b0110))
	f.Add(true, true, uint16(x509.KeyUsageCertSign), uint8(0))
	f.Add(false, true, uint16(x509.KeyUsageDigitalSignature), uint8(0b0001))
	f.Add(false, false, uint16(0), uint8(0b1000))
	ekus := []x509.ExtKeyUsage{x509.ExtKeyUsageAny, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageCodeSigning}
	f.Fuzz(func(t *testing.T, isCA, constraints bool, ku uint16, ekuMask uint8) {
		var eku []x509.ExtKeyUsage
		for i, u := range ekus {
			if ekuMask&(1<<i) != 0 {
				eku = append(eku, u)
			}
		}
		edit := func(c *x509.Certificate) {
			c.IsCA, c.BasicConstraintsValid = isCA && constraints, constraints
			c.KeyUsage = x509.KeyUsage(ku & 0x1ff)
			c.ExtKeyUsage = eku
		}
		chain := issue(t, ca, localca.Leaf{PublicKey: key.Public(), Identity: testID, Edit: edit})
		err := pki.VerifyIssued(chain, key.Public(), testID, ca.Pool(), now)
		leaf := chain[0]
		has := func(u x509.ExtKeyUsage) bool {
			for _, e := range leaf.ExtKeyUsage {
				if e == u || e == x509.ExtKeyUsageAny {
					return true
				}
			}
			return false
		}
		isCert := leaf.IsCA || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0
		usable := leaf.KeyUsage&x509.KeyUsageDigitalSignature != 0 && (len(leaf.ExtKeyUsage) == 0 || has(x509.ExtKeyUsageServerAuth) && has(x509.ExtKeyUsageClientAuth))
		switch {
		case isCert:
			if !errors.Is(err, pki.ErrLeafIsCA) {
				t.Fatalf("leaf that may sign (IsCA=%v KeyUsage=%b): %v", leaf.IsCA, leaf.KeyUsage, err)
			}
		case !usable:
			if !errors.Is(err, pki.ErrKeyUsage) {
				t.Fatalf("leaf without workload usages (KeyUsage=%b EKU=%v): %v", leaf.KeyUsage, leaf.ExtKeyUsage, err)
			}
		case err != nil:
			t.Fatalf("workload leaf (KeyUsage=%b EKU=%v) refused: %v", leaf.KeyUsage, leaf.ExtKeyUsage, err)
		}
	})
}
