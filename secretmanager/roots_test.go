package secretmanager

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func newCA(t testing.TB, cfg localca.Config) *localca.CA {
	t.Helper()
	ca, err := localca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestParseBundle(t *testing.T) {
	a := newCA(t, localca.Config{Name: "a"})
	b := newCA(t, localca.Config{Name: "b", Lifetime: time.Hour})
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
			got, err := ParseBundle(tt.data, "test")
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
			if len(got.Certs) != tt.certs {
				t.Fatalf("%d certificates, want %d", len(got.Certs), tt.certs)
			}
			if !got.NotAfter.Equal(got.Certs[len(got.Certs)-1].NotAfter) && tt.certs == 2 {
				t.Errorf("NotAfter %s is not the earliest expiry", got.NotAfter)
			}
			if got.Source != "test" || got.Pool == nil {
				t.Errorf("bundle %+v lacks source or pool", got)
			}
		})
	}
}

func TestRootsSetSignalsOnlyOnChange(t *testing.T) {
	a := newCA(t, localca.Config{Name: "a"})
	b := newCA(t, localca.Config{Name: "b"})
	r, err := NewRoots(a.RootPEM(), "file")
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := r.Watch()
	defer cancel()

	if err := r.Set(a.RootPEM(), "file"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("setting the same roots signalled a change")
	default:
	}
	if err := r.Set([]byte("broken"), "file"); err == nil {
		t.Fatal("Set accepted a broken bundle")
	}
	if !bytes.Equal(r.Bundle().PEM, a.RootPEM()) {
		t.Fatal("a broken bundle replaced the good one")
	}
	if err := r.Set(b.RootPEM(), "file"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("a new bundle was not signalled")
	}
	if !bytes.Equal(r.Bundle().PEM, b.RootPEM()) {
		t.Fatal("bundle not replaced")
	}
	leafKey, _ := pki.GenerateKey(pki.ECP256)
	chain, err := b.Issue(localca.Leaf{PublicKey: leafKey.Public(), Identity: testID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chain[0].Verify(x509VerifyOptions(r.Roots())); err != nil {
		t.Fatalf("Roots() pool does not verify a leaf of the new root: %v", err)
	}
}

func FuzzParseBundle(f *testing.F) {
	a := newCA(f, localca.Config{Name: "a"})
	f.Add(a.RootPEM())
	f.Add(append(a.RootPEM(), a.RootPEM()...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ParseBundle(data, "fuzz")
		if err != nil {
			return
		}
		if len(b.Certs) == 0 || b.Pool == nil {
			t.Fatal("accepted bundle without certificates")
		}
		again, err := ParseBundle(b.PEM, "fuzz")
		if err != nil || len(again.Certs) != len(b.Certs) {
			t.Fatalf("re-encoded bundle does not parse back: %v", err)
		}
	})
}

func TestRootsSetCRLKeepsItAcrossRootChanges(t *testing.T) {
	a, b := newCA(t, localca.Config{}).RootPEM(), newCA(t, localca.Config{}).RootPEM()
	r, err := NewRoots(a, "a")
	if err != nil {
		t.Fatal(err)
	}
	ch, stop := r.Watch()
	defer stop()
	r.SetCRL([]byte("crl"))
	select {
	case <-ch:
	default:
		t.Fatal("SetCRL did not signal")
	}
	r.SetCRL([]byte("crl"))
	select {
	case <-ch:
		t.Fatal("the same CRL signalled")
	default:
	}
	if err := r.Set(b, "b"); err != nil {
		t.Fatal(err)
	}
	if got := r.Bundle(); string(got.CRL) != "crl" || got.Source != "b" {
		t.Errorf("after Set: CRL %q source %q", got.CRL, got.Source)
	}
	r.SetCRL(nil)
	if got := r.Bundle(); got.CRL != nil || got.Source != "b" {
		t.Errorf("after SetCRL(nil): CRL %q source %q", got.CRL, got.Source)
	}
}
