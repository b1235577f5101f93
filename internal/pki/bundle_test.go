package pki_test

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func TestParseBundle(t *testing.T) {
	t.Parallel()
	newCA := func(cfg localca.Config) *localca.CA {
		ca, err := localca.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ca
	}
	a := newCA(localca.Config{Name: "a"})
	b := newCA(localca.Config{Name: "b", Lifetime: time.Hour})
	both := append(append([]byte{}, a.RootPEM()...), b.RootPEM()...)
	tests := []struct {
		name    string
		data    []byte
		certs   int
		wantErr error
	}{
		{"one root", a.RootPEM(), 1, nil},
		{"two roots", both, 2, nil},
		{"empty", nil, 0, pki.ErrNoCertificates},
		{"white space", []byte("\n \n"), 0, pki.ErrNoCertificates},
		{"garbage after", append(append([]byte{}, a.RootPEM()...), "junk"...), 0, nil},
		{"truncated", a.RootPEM()[:len(a.RootPEM())/2], 0, nil},
		{"key block", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pki.ParseBundle(tt.data)
			if tt.certs == 0 {
				if err == nil {
					t.Fatal("ParseBundle accepted bad input")
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			certs := got.Certs()
			if len(certs) != tt.certs {
				t.Fatalf("%d certificates, want %d", len(certs), tt.certs)
			}
			if tt.certs == 2 && !got.NotAfter().Equal(b.Root().NotAfter) {
				t.Errorf("NotAfter %s is not the earliest expiry %s", got.NotAfter(), b.Root().NotAfter)
			}
			if _, err := certs[0].Verify(x509.VerifyOptions{Roots: got.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Errorf("the pool does not hold the roots: %v", err)
			}
			again, err := pki.ParseBundle(got.PEM())
			if err != nil || !again.Equal(got) {
				t.Errorf("the PEM does not parse back to the same bundle: %v", err)
			}
		})
	}
	var none *pki.Bundle
	if !none.Equal(nil) || none.Equal(pki.NewBundle([]*x509.Certificate{a.Root()})) || len(none.Certs()) != 0 || none.PEM() != nil {
		t.Error("the nil bundle is not an empty one")
	}
}

func FuzzParseBundle(f *testing.F) {
	a, err := localca.New(localca.Config{Name: "a"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(a.RootPEM())
	f.Add(append(a.RootPEM(), a.RootPEM()...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := pki.ParseBundle(data)
		if err != nil {
			return
		}
		if len(b.Certs()) == 0 || b.Pool() == nil {
			t.Fatal("accepted bundle without certificates")
		}
		again, err := pki.ParseBundle(b.PEM())
		if err != nil || !again.Equal(b) {
			t.Fatalf("re-encoded bundle does not parse back: %v", err)
		}
	})
}
