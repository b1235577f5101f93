package trustroots

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// newCRL makes a PEM CRL of a fresh issuer that revokes serial.
func newCRL(t *testing.T, serial int64) []byte {
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
	crl, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(1), ThisUpdate: now, NextUpdate: now.Add(time.Hour),
		RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(serial), RevocationTime: now}},
	}, issuer, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: crl})
}

// The CRL file at pilot-agent's path, relative to the working directory,
// reaches ROOTCA's validation context on an open SDS stream, inline; a bad
// file is refused alone (the last good CRL stays and the roots are still
// served); a removed file means no CRL.
func TestCRLInROOTCA(t *testing.T) {
	a := newRoot(t, "root-a")
	ca := istioca.Start(t, istioca.Config{CA: a.ca, Tokens: map[string]istioca.ServiceAccount{workloadToken: workload}})
	dir := agentproc.TempDir(t)
	rootFile := filepath.Join(dir, "root-cert.pem")
	write(t, rootFile, a.ca.RootPEM())
	write(t, filepath.Join(dir, "istio-token"), []byte(workloadToken))
	crlFile := filepath.Join(dir, "var/run/secrets/istio/crl/ca-crl.pem")
	if err := os.MkdirAll(filepath.Dir(crlFile), 0o755); err != nil {
		t.Fatal(err)
	}
	p := agentproc.Start(t, dir,
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", "MESHAGENT_XDS_PROXY=false", "MESHAGENT_LOG_LEVEL=debug",
		"CA_ADDR="+ca.Addr(), "ISTIOD_SAN="+istioca.DefaultServerName, "CA_ROOT_CA="+rootFile,
		"POD_NAMESPACE="+workload.Namespace, "SERVICE_ACCOUNT="+workload.Name,
		"MESHAGENT_TOKEN_PATH="+filepath.Join(dir, "istio-token"), "FILE_DEBOUNCE_DURATION=50ms",
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: []string{secretmanager.RootCertName}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	// next waits for a ROOTCA whose CRL is want (nil: none), with the roots.
	next := func(want []byte) {
		t.Helper()
		for {
			r, err := st.Next(ctx)
			if err != nil {
				t.Fatalf("no ROOTCA with the CRL %.40q: %v", want, err)
			}
			vc := r.Secrets[secretmanager.RootCertName].GetValidationContext()
			if !bytes.Equal(vc.GetTrustedCa().GetInlineBytes(), a.ca.RootPEM()) {
				t.Fatalf("ROOTCA roots changed: %q", vc.GetTrustedCa().GetInlineBytes())
			}
			got := vc.GetCrl().GetInlineBytes()
			if vc.GetCrl().GetFilename() != "" {
				t.Fatalf("the CRL is served as a file name: %q", vc.GetCrl().GetFilename())
			}
			if bytes.Equal(got, want) && (want != nil || vc.GetCrl() == nil) {
				return
			}
		}
	}
	next(nil)
	one, two := newCRL(t, 1), newCRL(t, 2)
	write(t, crlFile, one)
	next(one)

	write(t, crlFile, []byte("-----BEGIN X509 CRL-----\ntruncated"))
	waitLog(t, p, `"msg":"files rejected, keeping the last good value","source":"./var/run/secrets/istio/crl/ca-crl.pem"`)
	r, err := c.Fetch(ctx, secretmanager.RootCertName)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Secrets[secretmanager.RootCertName].GetValidationContext().GetCrl().GetInlineBytes(); !bytes.Equal(got, one) {
		t.Fatalf("after a bad CRL file, ROOTCA's CRL is %.60q, want the last good one", got)
	}
	write(t, crlFile, two)
	next(two)

	if err := os.Remove(crlFile); err != nil {
		t.Fatal(err)
	}
	next(nil)
}

// waitLog waits until the agent's log holds s.
func waitLog(t *testing.T, p *agentproc.Proc, s string) {
	t.Helper()
	testwait.Within(t, 20*time.Second, "the agent to log "+s, func() bool { return strings.Contains(p.Logs(), s) })
}
