package grpcbootstrap

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
)

// x509SVIDUse marks a JWK as an X.509 authority in a SPIFFE bundle.
const x509SVIDUse = "x509-svid"

type bundleMap struct {
	TrustDomains map[string]jwks `json:"trust_domains"`
}

type jwks struct {
	Keys []jwk `json:"keys"`
}

// jwk is a public key in JWK form (RFC 7517, 7518, 8037) with its
// certificate.
type jwk struct {
	Kty string   `json:"kty"`
	Use string   `json:"use"`
	Crv string   `json:"crv,omitempty"`
	X   string   `json:"x,omitempty"`
	Y   string   `json:"y,omitempty"`
	N   string   `json:"n,omitempty"`
	E   string   `json:"e,omitempty"`
	X5c []string `json:"x5c"`
}

// BundleMap encodes X.509 trust bundles, by trust domain name, as a SPIFFE
// trust bundle map (gRFC A87): {"trust_domains": {"<td>": <JWKS>}}, one
// JWK with use "x509-svid" and the certificate in x5c per root.
func BundleMap(bundles map[string][]*x509.Certificate) ([]byte, error) {
	if len(bundles) == 0 {
		return nil, errors.New("grpcbootstrap: no trust bundles")
	}
	m := bundleMap{TrustDomains: make(map[string]jwks, len(bundles))}
	names := make([]string, 0, len(bundles))
	for td := range bundles {
		names = append(names, td)
	}
	sort.Strings(names)
	for _, td := range names {
		if err := validTrustDomain(td); err != nil {
			return nil, err
		}
		roots := bundles[td]
		if len(roots) == 0 {
			return nil, fmt.Errorf("grpcbootstrap: trust domain %q has no roots", td)
		}
		set := jwks{Keys: make([]jwk, 0, len(roots))}
		for i, c := range roots {
			k, err := certJWK(c)
			if err != nil {
				return nil, fmt.Errorf("grpcbootstrap: trust domain %q root %d: %w", td, i, err)
			}
			set.Keys = append(set.Keys, k)
		}
		m.TrustDomains[td] = set
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("grpcbootstrap: encoding trust bundle map: %w", err)
	}
	return append(out, '\n'), nil
}

// WriteBundleMap writes BundleMap(bundles) to path atomically (mode 0644)
// unless it already holds exactly that, and reports whether it wrote.
func WriteBundleMap(path string, bundles map[string][]*x509.Certificate) (bool, error) {
	data, err := BundleMap(bundles)
	if err != nil {
		return false, err
	}
	return writeFile(path, data)
}

// validTrustDomain checks a trust domain name: lower-case letters, digits,
// '.', '-' and '_' (SPIFFE ID standard, section 2.1).
func validTrustDomain(td string) error {
	if td == "" {
		return errors.New("grpcbootstrap: empty trust domain")
	}
	for _, r := range td {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return fmt.Errorf("grpcbootstrap: trust domain %q: character %q not allowed", td, r)
		}
	}
	return nil
}

var b64url = base64.RawURLEncoding

func certJWK(c *x509.Certificate) (jwk, error) {
	k := jwk{Use: x509SVIDUse, X5c: []string{base64.StdEncoding.EncodeToString(c.Raw)}}
	switch pub := c.PublicKey.(type) {
	case *ecdsa.PublicKey:
		point, err := pub.Bytes() // 0x04 || X || Y, each the curve's size
		if err != nil {
			return jwk{}, err
		}
		size := (len(point) - 1) / 2
		k.Kty, k.Crv = "EC", pub.Curve.Params().Name
		k.X, k.Y = b64url.EncodeToString(point[1:1+size]), b64url.EncodeToString(point[1+size:])
	case *rsa.PublicKey:
		k.Kty = "RSA"
		k.N = b64url.EncodeToString(pub.N.Bytes())
		k.E = b64url.EncodeToString(big.NewInt(int64(pub.E)).Bytes())
	case ed25519.PublicKey:
		k.Kty, k.Crv = "OKP", "Ed25519"
		k.X = b64url.EncodeToString(pub)
	default:
		return jwk{}, fmt.Errorf("public key type %T not supported", c.PublicKey)
	}
	return k, nil
}
