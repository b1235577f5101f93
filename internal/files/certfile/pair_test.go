package certfile

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func TestParsePair(t *testing.T) {
	ca := newCA(t)
	now := time.Now()
	good := issue(t, ca, localca.Leaf{TTL: time.Hour})
	other := issue(t, ca, localca.Leaf{TTL: time.Hour})
	expired := issue(t, ca, localca.Leaf{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)})

	rsaKey, err := pki.GenerateKey(pki.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaChain, err := ca.Issue(localca.Leaf{PublicKey: rsaKey.Public(), Identity: testID, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey.(*rsa.PrivateKey))})

	leafOnly := pki.EncodeCertificates(good.chain[:1])
	tests := []struct {
		name     string
		chain    []byte
		key      []byte
		wantErr  error // nil: must succeed
		anyError bool
	}{
		{name: "good", chain: good.chainPEM, key: good.keyPEM},
		{name: "leaf only", chain: leafOnly, key: good.keyPEM},
		{name: "RSA PKCS#1 key", chain: pki.EncodeCertificates(rsaChain[:2]), key: pkcs1},
		{name: "chain with surrounding white space", chain: append(append([]byte("\n\n"), good.chainPEM...), "\n\n"...), key: good.keyPEM},
		{name: "key of another certificate", chain: good.chainPEM, key: other.keyPEM, wantErr: pki.ErrKeyMismatch},
		{name: "expired", chain: expired.chainPEM, key: expired.keyPEM, wantErr: pki.ErrNotValidNow},
		{name: "truncated key", chain: good.chainPEM, key: good.keyPEM[:len(good.keyPEM)/2], anyError: true},
		{name: "key cut inside the base64", chain: good.chainPEM, key: good.keyPEM[:len(good.keyPEM)-40], anyError: true},
		{name: "truncated chain", chain: good.chainPEM[:len(good.chainPEM)-100], key: good.keyPEM, anyError: true},
		{name: "chain cut inside the first certificate", chain: good.chainPEM[:200], key: good.keyPEM, anyError: true},
		{name: "empty chain", chain: nil, key: good.keyPEM, wantErr: pki.ErrNoCertificates},
		{name: "empty key", chain: good.chainPEM, key: nil, anyError: true},
		{name: "two keys", chain: good.chainPEM, key: append(bytes.Clone(good.keyPEM), other.keyPEM...), anyError: true},
		{name: "key in the chain file", chain: append(bytes.Clone(good.chainPEM), good.keyPEM...), key: good.keyPEM, anyError: true},
		{name: "files swapped", chain: good.keyPEM, key: good.chainPEM, anyError: true},
		{name: "garbage after the chain", chain: append(bytes.Clone(good.chainPEM), "garbage"...), key: good.keyPEM, anyError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePair(tt.chain, tt.key, now)
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
			case tt.anyError:
				if err == nil {
					t.Fatal("accepted")
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if !pki.PublicKeysEqual(p.Key.Public(), p.Leaf().PublicKey) {
					t.Fatal("key does not match leaf")
				}
				// The normalised forms parse back to the same pair.
				again, err := ParsePair(p.ChainPEM, p.KeyPEM, now)
				if err != nil || !again.Equal(p) {
					t.Fatalf("normalised pair does not round-trip: %v", err)
				}
				if block, _ := pem.Decode(p.KeyPEM); block == nil || block.Type != "PRIVATE KEY" {
					t.Fatal("key not normalised to PKCS#8")
				}
				if tc := p.TLSCertificate(); len(tc.Certificate) != len(p.Chain) || tc.PrivateKey != p.Key {
					t.Fatal("TLSCertificate does not carry the pair")
				}
			}
		})
	}
}

func TestLoadPair(t *testing.T) {
	ca := newCA(t)
	good := issue(t, ca, localca.Leaf{TTL: time.Hour})
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")

	_, err := LoadPair(cert, key, time.Now())
	if !errors.Is(err, fs.ErrNotExist) || Reason(err) != "missing" {
		t.Fatalf("missing files: %v (reason %q)", err, Reason(err))
	}
	writeFile(t, cert, good.chainPEM)
	writeFile(t, key, good.keyPEM[:30])
	_, err = LoadPair(cert, key, time.Now())
	if err == nil || Reason(err) != "malformed" {
		t.Fatalf("truncated key: %v (reason %q)", err, Reason(err))
	}
	writeFile(t, key, good.keyPEM)
	p, err := LoadPair(cert, key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !p.Leaf().Equal(good.chain[0]) {
		t.Fatal("wrong leaf")
	}
}

func TestParseBundle(t *testing.T) {
	a := newCA(t)
	b, err := localca.New(localca.Config{Lifetime: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	both := append(a.RootPEM(), b.RootPEM()...)
	bundle, err := pki.ParseBundle(both)
	if err != nil {
		t.Fatal(err)
	}
	if !bundle.NotAfter().Equal(b.Root().NotAfter) {
		t.Fatalf("NotAfter %s, want the shorter-lived root's %s", bundle.NotAfter(), b.Root().NotAfter)
	}
	if len(bundle.Certs()) != 2 || !bytes.Equal(bundle.PEM(), both) {
		t.Fatalf("bundle holds %d certificates", len(bundle.Certs()))
	}
	for _, root := range []*x509.Certificate{a.Root(), b.Root()} {
		if _, err := root.Verify(x509.VerifyOptions{Roots: bundle.Pool()}); err != nil {
			t.Fatalf("pool misses a root: %v", err)
		}
	}
	for name, data := range map[string][]byte{
		"truncated":   both[:len(both)-50],
		"empty":       nil,
		"white space": []byte("  \n"),
		"key block":   append(bytes.Clone(both), issue(t, a, localca.Leaf{}).keyPEM...),
	} {
		if _, err := pki.ParseBundle(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
