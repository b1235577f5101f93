package outputcerts

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
)

// BundleMap encodes roots as a SPIFFE trust bundle map with the one trust
// domain td: {"trust_domains": {"<td>": <SPIFFE bundle: a JWK set whose
// keys have use "x509-svid" and one certificate each in x5c>}}, as gRPC's
// spiffe_trust_bundle_map_file reads it. Roots whose key is neither RSA nor
// ECDSA on P-256, P-384 or P-521 are an error.
func BundleMap(td string, roots []*x509.Certificate) ([]byte, error) {
	if td == "" || len(roots) == 0 {
		return nil, errors.New("outputcerts: a bundle map needs a trust domain and roots")
	}
	keys := make([]map[string]any, 0, len(roots))
	for i, c := range roots {
		k, err := jwk(c)
		if err != nil {
			return nil, fmt.Errorf("outputcerts: bundle map: root %d: %w", i, err)
		}
		keys = append(keys, k)
	}
	out, err := json.MarshalIndent(map[string]any{
		"trust_domains": map[string]any{td: map[string]any{"keys": keys}},
	}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("outputcerts: bundle map: %w", err)
	}
	return append(out, '\n'), nil
}

// jwk is c's public key as a JSON Web Key with c in x5c.
func jwk(c *x509.Certificate) (map[string]any, error) {
	b64 := base64.RawURLEncoding.EncodeToString
	k := map[string]any{"use": "x509-svid", "x5c": []string{base64.StdEncoding.EncodeToString(c.Raw)}}
	switch pub := c.PublicKey.(type) {
	case *rsa.PublicKey:
		k["kty"], k["n"], k["e"] = "RSA", b64(pub.N.Bytes()), b64(big.NewInt(int64(pub.E)).Bytes())
	case *ecdsa.PublicKey:
		point, err := pub.Bytes() // 0x04 || X || Y
		if err != nil {
			return nil, err
		}
		size := (len(point) - 1) / 2
		k["kty"], k["crv"] = "EC", pub.Curve.Params().Name
		k["x"], k["y"] = b64(point[1:1+size]), b64(point[1+size:])
	default:
		return nil, fmt.Errorf("key type %T cannot be written as a JWK here", c.PublicKey)
	}
	return k, nil
}
