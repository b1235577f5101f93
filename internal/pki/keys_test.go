package pki_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/internal/pki"
)

func TestGenerateKeyTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kt    pki.KeyType
		curve elliptic.Curve
		bits  int
	}{
		{pki.ECP256, elliptic.P256(), 0},
		{"", elliptic.P256(), 0},
		{pki.ECP384, elliptic.P384(), 0},
		{pki.RSA2048, nil, 2048},
		{pki.RSA3072, nil, 3072},
		{pki.RSA4096, nil, 4096},
	}
	for _, tt := range tests {
		t.Run(string(tt.kt), func(t *testing.T) {
			if testing.Short() && tt.bits > 2048 {
				t.Skip("slow RSA key generation")
			}
			k, err := pki.GenerateKey(tt.kt)
			if err != nil {
				t.Fatal(err)
			}
			switch k := k.(type) {
			case *ecdsa.PrivateKey:
				if tt.curve == nil || k.Curve != tt.curve {
					t.Errorf("got EC key on %v", k.Curve.Params().Name)
				}
			case *rsa.PrivateKey:
				if k.N.BitLen() != tt.bits {
					t.Errorf("got RSA %d bits, want %d", k.N.BitLen(), tt.bits)
				}
			default:
				t.Errorf("key type %T", k)
			}
			pemBytes, err := pki.EncodeKeyPEM(k)
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(pemBytes)
			if block == nil || block.Type != "PRIVATE KEY" {
				t.Fatalf("not a PKCS#8 PEM block: %q", pemBytes)
			}
			back, err := pki.ParseKeyPEM(pemBytes)
			if err != nil {
				t.Fatal(err)
			}
			if !pki.PublicKeysEqual(k.Public(), back.Public()) {
				t.Error("round trip changed the key")
			}
		})
	}
	if _, err := pki.GenerateKey("ed25519"); err == nil {
		t.Error("unknown key type accepted")
	}
}

func TestParseKeyPEMForms(t *testing.T) {
	t.Parallel()
	ec := newKey(t).(*ecdsa.PrivateKey)
	sec1, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := pki.GenerateKey(pki.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs1 := x509.MarshalPKCS1PrivateKey(rsaKey.(*rsa.PrivateKey))
	type privateKey interface{ Equal(crypto.PrivateKey) bool }
	for name, tt := range map[string]struct {
		data []byte
		want privateKey
	}{
		"SEC 1":  {pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}), ec},
		"PKCS#1": {pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: pkcs1}), rsaKey.(*rsa.PrivateKey)},
	} {
		got, err := pki.ParseKeyPEM(tt.data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !tt.want.Equal(got) {
			t.Errorf("%s: parsed a %T that is not the key encoded", name, got)
		}
	}
}

func TestParseKeyPEMRejects(t *testing.T) {
	t.Parallel()
	good, err := pki.EncodeKeyPEM(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	ca := newCA(t, nowUTC())
	tests := map[string]struct {
		data []byte
		want string
	}{
		"empty":           {nil, "no PEM block"},
		"not PEM":         {[]byte("hello"), "no PEM block"},
		"certificate":     {ca.RootPEM(), `"CERTIFICATE" is not a private key`},
		"two keys":        {append(append([]byte{}, good...), good...), "unexpected data after"},
		"trailing junk":   {append(append([]byte{}, good...), "junk"...), "unexpected data after"},
		"bad DER":         {pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}), "parsing PRIVATE KEY"},
		"truncated block": {good[:len(good)/2], "no PEM block"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := pki.ParseKeyPEM(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestPublicKeysEqual(t *testing.T) {
	t.Parallel()
	a, b := newKey(t), newKey(t)
	if !pki.PublicKeysEqual(a.Public(), a.Public()) || pki.PublicKeysEqual(a.Public(), b.Public()) {
		t.Error("wrong equality")
	}
	if pki.PublicKeysEqual(nil, a.Public()) {
		t.Error("nil key equal to a key")
	}
}
