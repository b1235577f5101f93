package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// KeyType names a workload key algorithm and size.
type KeyType string

// The supported key types. ECP256 is the default.
const (
	ECP256  KeyType = "ec-p256"
	ECP384  KeyType = "ec-p384"
	RSA2048 KeyType = "rsa-2048"
	RSA3072 KeyType = "rsa-3072"
	RSA4096 KeyType = "rsa-4096"
)

// KeyTypes lists every supported key type, default first.
var KeyTypes = []KeyType{ECP256, ECP384, RSA2048, RSA3072, RSA4096}

// GenerateKey makes a fresh private key in memory.
func GenerateKey(t KeyType) (crypto.Signer, error) {
	switch t {
	case ECP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	}
	return nil, fmt.Errorf("unknown key type %q", t)
}

// EncodeKeyPEM encodes a private key as a PKCS#8 "PRIVATE KEY" PEM block.
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKeyPEM parses exactly one private key PEM block (PKCS#8, PKCS#1 or SEC 1).
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found in private key data")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("unexpected data after the private key PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block type %q is not a private key", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", block.Type, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	return signer, nil
}

// PublicKeysEqual reports whether two public keys are the same key.
func PublicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	ea, ok := a.(equaler)
	return ok && ea.Equal(b)
}
