package istio

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// sep splits fuzz input into the strings of a cert_chain.
const sep = "\x00"

func chainSeeds(f *testing.F) [][]byte {
	f.Helper()
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		f.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		f.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "ns", "sa"), TTL: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	var each [][]byte
	for _, c := range chain {
		each = append(each, pki.EncodeCertificates(chain[:0:0]), pki.EncodeCertificates(append(chain[:0:0], c)))
	}
	all := pki.EncodeCertificates(chain)
	leaf := each[1]
	return [][]byte{
		bytes.Join([][]byte{each[1], each[3], each[5]}, []byte(sep)),
		all,
		bytes.Join([][]byte{leaf, pki.EncodeCertificates(chain[1:])}, []byte(sep)),
		append(append([]byte{}, leaf...), []byte("trailing junk")...),
		[]byte(strings.Replace(string(leaf), "CERTIFICATE", "PRIVATE KEY", 2)),
		leaf[:len(leaf)/2],
		[]byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"),
		[]byte(sep),
		{},
	}
}

// FuzzParseCertChain feeds arbitrary cert_chain strings to the answer parser:
// it must never panic, and what it accepts must be whole certificates that
// survive a round trip.
func FuzzParseCertChain(f *testing.F) {
	for _, s := range chainSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var chain []string
		if len(data) > 0 {
			chain = strings.Split(string(data), sep)
		}
		certs, err := ParseCertChain(chain)
		if err != nil {
			if !errors.Is(err, ErrBadAnswer) {
				t.Fatalf("error %v does not wrap ErrBadAnswer", err)
			}
			if certs != nil {
				t.Fatal("certificates returned with an error")
			}
			return
		}
		if len(certs) < len(chain) {
			t.Fatalf("%d certificates from %d strings", len(certs), len(chain))
		}
		again, err := ParseCertChain([]string{string(pki.EncodeCertificates(certs))})
		if err != nil {
			t.Fatalf("re-parsing accepted chain: %v", err)
		}
		if len(again) != len(certs) {
			t.Fatalf("round trip gave %d certificates, want %d", len(again), len(certs))
		}
		for i := range certs {
			if !certs[i].Equal(again[i]) {
				t.Fatalf("certificate %d changed in the round trip", i)
			}
		}
	})
}

func TestParseCertChain(t *testing.T) {
	ca, err := localca.New(localca.Config{Intermediate: true})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Issue(localca.Leaf{PublicKey: key.Public(), Identity: pki.SPIFFEIdentity("cluster.local", "ns", "sa"), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pemOf := func(i, j int) string { return string(pki.EncodeCertificates(chain[i:j])) }
	tests := []struct {
		name  string
		chain []string
		want  int // certificates; 0 means an error
	}{
		{"one per string", []string{pemOf(0, 1), pemOf(1, 2), pemOf(2, 3)}, 3},
		{"all in one string", []string{pemOf(0, 3)}, 3},
		{"mixed", []string{pemOf(0, 1), pemOf(1, 3)}, 3},
		{"leaf only", []string{pemOf(0, 1)}, 1},
		{"empty chain", nil, 0},
		{"empty string", []string{pemOf(0, 1), ""}, 0},
		{"junk after a certificate", []string{pemOf(0, 1) + "junk"}, 0},
		{"not PEM", []string{"hello"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCertChain(tt.chain)
			if tt.want == 0 {
				if !errors.Is(err, ErrBadAnswer) {
					t.Fatalf("error %v, want ErrBadAnswer", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want {
				t.Fatalf("%d certificates, want %d", len(got), tt.want)
			}
			for i, c := range got {
				if !c.Equal(chain[i]) {
					t.Errorf("certificate %d out of order", i)
				}
			}
		})
	}
}
