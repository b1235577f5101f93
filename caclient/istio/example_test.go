package istio_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/caclient/istio"
	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/pki"
)

// How the agent wires the Istio CA client from its settings (CA_ADDR,
// ISTIOD_SAN, the CA root, the token file, ISTIO_META_CLUSTER_ID,
// CA_HEADER_*, ISTIO_META_CERT_SIGNER) and checks what comes back.
func ExampleNew() {
	rootPEM, err := os.ReadFile("./var/run/secrets/istio/root-cert.pem")
	if err != nil {
		fmt.Println(err)
		return
	}
	roots, err := pki.ParseCertificates(rootPEM)
	if err != nil {
		fmt.Println(err)
		return
	}
	addr := "istiod.istio-system.svc:15012"
	client, err := istio.New(istio.Config{
		Transport: caclient.TransportConfig{
			Addr:      addr,
			Plaintext: istio.PlaintextPort(addr),
			Roots:     caclient.StaticRoots{Pool: pki.CertPool(roots)},
			Token:     credfetcher.File{Path: "./var/run/secrets/tokens/istio-token"},
			Metadata:  map[string]string{"ClusterID": "Kubernetes"},
		},
		CertSigner: os.Getenv("ISTIO_META_CERT_SIGNER"),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	id := pki.SPIFFEIdentity("cluster.local", "default", "app")
	key, _ := pki.GenerateKey(pki.ECP256)
	csr, _ := pki.NewCSR(key, id)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	chain, err := client.Sign(ctx, csr, id, 24*time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	var pool *x509.CertPool = pki.CertPool(roots)
	if err := pki.VerifyIssued(chain, key.Public(), id, pool, time.Now()); err != nil {
		fmt.Println("rejected:", pki.Reason(err))
	}
}
