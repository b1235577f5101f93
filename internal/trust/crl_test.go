package trust

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshagent/meshagent/internal/files/certfile"
)

// newCRL makes a PEM CRL of a fresh issuer that revokes serials.
func newCRL(t testing.TB, serials ...int64) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "crl issuer"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCRLSign | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	rl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: now, NextUpdate: now.Add(time.Hour)}
	for _, s := range serials {
		rl.RevokedCertificateEntries = append(rl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: big.NewInt(s), RevocationTime: now})
	}
	crl, err := x509.CreateRevocationList(rand.Reader, rl, issuer, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: crl})
}

func TestParseCRL(t *testing.T) {
	one, two := newCRL(t, 7), newCRL(t, 8, 9)
	tests := []struct {
		name  string
		data  []byte
		lists int
	}{
		{"one list", one, 1},
		{"two lists with white space", append(append([]byte("\n"), one...), append([]byte("\n\n"), two...)...), 2},
		{"empty", nil, -1},
		{"white space", []byte(" \n"), -1},
		{"a certificate", newRoot(t, "a"), -1},
		{"trailing text", append(append([]byte{}, one...), "junk"...), -1},
		{"truncated", one[:len(one)/2], -1},
		{"bad DER", pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte("nope")}), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCRL(tt.data)
			if tt.lists < 0 {
				if !errors.Is(err, ErrNotCRL) {
					t.Fatalf("error %v, want ErrNotCRL", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Lists) != tt.lists {
				t.Errorf("%d lists, want %d", len(c.Lists), tt.lists)
			}
			if again, err := ParseCRL(c.PEM); err != nil || !again.Equal(c) {
				t.Errorf("re-encoded CRL parses to %v, %v", again, err)
			}
		})
	}
}

func FuzzParseCRL(f *testing.F) {
	f.Add(newCRL(f, 1))
	f.Add(append(newCRL(f), newCRL(f, 2, 3)...))
	f.Add([]byte("-----BEGIN X509 CRL-----\nMAA=\n-----END X509 CRL-----\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCRL(data)
		if err != nil {
			if c != nil || !errors.Is(err, ErrNotCRL) {
				t.Fatalf("error %v with value %v", err, c)
			}
			return
		}
		if len(c.Lists) == 0 || len(c.PEM) == 0 {
			t.Fatalf("accepted with %d lists", len(c.Lists))
		}
		again, err := ParseCRL(c.PEM)
		if err != nil || !bytes.Equal(again.PEM, c.PEM) {
			t.Fatalf("re-encoded CRL does not parse the same: %v", err)
		}
	})
}

// crlSink records the CRLs set.
type crlSink struct {
	mu   sync.Mutex
	last []byte
	n    int
}

func (s *crlSink) SetCRL(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.n = b, s.n+1
}

func (s *crlSink) get() ([]byte, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.n
}

func TestCRLFeed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "crl", "ca-crl.pem")
	sink := &crlSink{}
	reg := prometheus.NewRegistry()
	f, err := NewCRLFeed(CRLFeedConfig{Path: path, Into: sink, Source: certfile.SourceConfig{Debounce: 10 * time.Millisecond, Registerer: reg}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, f)
	// No file: no CRL.
	eventually(t, "no CRL set", func() bool { b, n := sink.get(); return n == 1 && b == nil })

	one, two := newCRL(t, 1), newCRL(t, 2)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(one)
	eventually(t, "the first CRL", func() bool { b, _ := sink.get(); return bytes.Equal(b, one) })
	// A bad file is refused (counted); the last good CRL stays until a
	// good one comes.
	write([]byte("-----BEGIN X509 CRL-----\ngarbage\n"))
	eventually(t, "the refusal", func() bool {
		n, err := testutil.GatherAndCount(reg, "meshagent_certfile_load_failures_total")
		return err == nil && n > 0
	})
	if b, _ := sink.get(); !bytes.Equal(b, one) {
		t.Fatal("the last good CRL was not kept")
	}
	write(two)
	eventually(t, "the second CRL", func() bool { b, _ := sink.get(); return bytes.Equal(b, two) })
	_, n := sink.get()
	write([]byte("junk"))
	// The refusal is counted by the file source; nothing new is set.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no CRL once the file is gone", func() bool { b, m := sink.get(); return b == nil && m == n+1 })
}
