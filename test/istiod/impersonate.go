package istiod

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// Impersonate is one CreateCertificate on cc (a connection to istiod's CA)
// with token and ImpersonatedIdentity id, as a node agent or ztunnel sends
// it: a fresh P-256 key, a CSR for id, an hour's validity. It returns the
// certificate chain istiod answers.
func Impersonate(ctx context.Context, cc grpc.ClientConnInterface, token, id string) ([]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(id)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		return nil, err
	}
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": id})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx,
		"authorization", "Bearer "+token, "ClusterID", ClusterID), 20*time.Second)
	defer cancel()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
		ValidityDuration: 3600,
		Metadata:         md,
	})
	if err != nil {
		return nil, err
	}
	return resp.GetCertChain(), nil
}
