package pki_test

import (
	"bytes"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

func nowUTC() time.Time { return time.Now().UTC().Truncate(time.Second) }

func TestParseCertificatesBundle(t *testing.T) {
	t.Parallel()
	ca := newCA(t, nowUTC())
	chain := issue(t, ca, localca.Leaf{PublicKey: newKey(t).Public(), Identity: testID})
	if len(chain) != 3 {
		t.Fatalf("chain of %d", len(chain))
	}
	bundle := pki.EncodeCertificates(chain)
	for name, data := range map[string][]byte{
		"plain":        bundle,
		"white space":  append(append([]byte("\n\n  "), bundle...), "\n\n\t"...),
		"CRLF":         bytes.ReplaceAll(bundle, []byte("\n"), []byte("\r\n")),
		"no final EOL": bytes.TrimRight(bundle, "\n"),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := pki.ParseCertificates(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 {
				t.Fatalf("%d certs", len(got))
			}
			for i := range got {
				if !got[i].Equal(chain[i]) {
					t.Errorf("cert %d differs", i)
				}
			}
		})
	}
	ders := [][]byte{chain[0].Raw, chain[1].Raw}
	got, err := pki.ParseCertificatesDER(ders...)
	if err != nil || len(got) != 2 || !got[1].Equal(chain[1]) {
		t.Errorf("DER: %v", err)
	}
	pool := pki.CertPool(chain[2:])
	if _, err := chain[1].Verify(verifyOpts(pool)); err != nil {
		t.Errorf("pool: %v", err)
	}
}

func TestParseCertificatesRejects(t *testing.T) {
	t.Parallel()
	ca := newCA(t, nowUTC())
	cert := ca.RootPEM()
	key, err := pki.EncodeKeyPEM(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		data []byte
		want string
	}{
		"nothing":          {nil, "no certificates found"},
		"blank":            {[]byte(" \n\t"), "no certificates found"},
		"garbage":          {[]byte("not pem"), "certificate 0: data is not PEM"},
		"key":              {key, `certificate 0: PEM block type "PRIVATE KEY", want CERTIFICATE`},
		"key after cert":   {append(append([]byte{}, cert...), key...), `certificate 1: PEM block type "PRIVATE KEY"`},
		"junk after cert":  {append(append([]byte{}, cert...), "junk"...), "certificate 1: data is not PEM"},
		"bad DER":          {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30, 0x03, 1, 2, 3}}), "certificate 0:"},
		"half written":     {cert[:len(cert)/2], "certificate 0: data is not PEM"},
		"second truncated": {append(append([]byte{}, cert...), cert[:len(cert)-30]...), "certificate 1: data is not PEM"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := pki.ParseCertificates(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
			if got != nil {
				t.Error("certificates returned with an error")
			}
		})
	}
	if _, err := pki.ParseCertificates(nil); !errors.Is(err, pki.ErrNoCertificates) {
		t.Errorf("%v is not ErrNoCertificates", err)
	}
	if _, err := pki.ParseCertificatesDER(); !errors.Is(err, pki.ErrNoCertificates) {
		t.Errorf("%v is not ErrNoCertificates", err)
	}
	if _, err := pki.ParseCertificatesDER([]byte{1}); err == nil {
		t.Error("bad DER accepted")
	}
}
