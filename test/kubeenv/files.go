package kubeenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// files are the credentials the API server is started with, made fresh for each Env.
type files struct {
	caPEM                   []byte
	servingCert, servingKey string
	saPublic, saPrivate     string
	tokens                  string
	adminToken              string
	nodeTokens              map[string]string
}

func writeFiles(dir string, nodes []string) (files, error) {
	var f files
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return f, err
	}
	if err := f.writeServing(pki); err != nil {
		return f, err
	}
	if err := f.writeServiceAccountKey(pki); err != nil {
		return f, err
	}
	return f, f.writeTokens(pki, nodes)
}

// writeServing makes the CA and the API server's serving certificate.
func (f *files) writeServing(pki string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubeenv-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	f.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	servingTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTmpl, ca, &servingKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	servingKeyDER, err := x509.MarshalPKCS8PrivateKey(servingKey)
	if err != nil {
		return err
	}
	f.servingCert = filepath.Join(pki, "serving.crt")
	f.servingKey = filepath.Join(pki, "serving.key")
	if err := writePEM(f.servingCert, "CERTIFICATE", servingDER); err != nil {
		return err
	}
	if err := writePEM(f.servingKey, "PRIVATE KEY", servingKeyDER); err != nil {
		return err
	}
	return nil
}

// writeServiceAccountKey makes the key that signs service-account tokens.
func (f *files) writeServiceAccountKey(pki string) error {
	// The service-account token signing key: RSA, as most clusters use.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	f.saPrivate = filepath.Join(pki, "sa.key")
	f.saPublic = filepath.Join(pki, "sa.pub")
	if err := writePEM(f.saPrivate, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return err
	}
	if err := writePEM(f.saPublic, "PUBLIC KEY", saPub); err != nil {
		return err
	}
	return nil
}

// writeTokens writes the static token file: the admin's and one per
// node's kubelet.
func (f *files) writeTokens(pki string, nodes []string) error {
	// token,user,uid,"group,...": one static admin, in the group RBAC lets do anything.
	f.adminToken = randomHex(24)
	f.tokens = filepath.Join(pki, "tokens.csv")
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", f.adminToken, AdminUser, AdminUser)
	// One kubelet per node: user system:node:<name>, group system:nodes.
	f.nodeTokens = map[string]string{}
	for _, n := range nodes {
		tok := randomHex(24)
		f.nodeTokens[n] = tok
		line += fmt.Sprintf("%s,system:node:%s,system:node:%s,\"system:nodes\"\n", tok, n, n)
	}
	if err := os.WriteFile(f.tokens, []byte(line), 0o600); err != nil {
		return err
	}
	return nil
}

func writePEM(path, blockType string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600)
}
