package linkerd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/controlplane"
	"github.com/meshagent/meshagent/internal/localca"
)

const testServerName = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"

func tlsInfo(t *testing.T, names ...string) credentials.TLSInfo {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.ServerTLS(names, nil)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Leaf}}}
}

// plaintextInfo is the AuthInfo gRPC's insecure credentials report.
func plaintextInfo(t *testing.T) credentials.AuthInfo {
	t.Helper()
	_, info, err := insecure.NewCredentials().ClientHandshake(context.Background(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestTokenGate(t *testing.T) {
	tests := []struct {
		name              string
		auth              credentials.AuthInfo
		plaintextLoopback bool
		pass              bool
	}{
		{"TLS peer with the expected name", tlsInfo(t, testServerName), false, true},
		{"TLS peer with another name", tlsInfo(t, "evil.example"), false, false},
		{"TLS peer with another name over loopback", tlsInfo(t, "evil.example"), true, false},
		{"TLS peer without certificate", credentials.TLSInfo{}, false, false},
		{"plaintext", plaintextInfo(t), false, false},
		{"plaintext to loopback", plaintextInfo(t), true, true},
		{"no handshake information", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &identitypb.CertifyRequest{Identity: "web"}
			g := &tokenGate{serverName: testServerName, plaintextLoopback: tt.plaintextLoopback, token: []byte("secret"), req: req}
			ctx := credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{AuthInfo: tt.auth})
			md, err := g.GetRequestMetadata(ctx)
			if len(md) != 0 {
				t.Errorf("gate added metadata %v", md)
			}
			if tt.pass {
				if err != nil || g.refused() != nil {
					t.Fatalf("refused: %v / %v", err, g.refused())
				}
				if string(req.GetToken()) != "secret" {
					t.Fatalf("token not placed in the body")
				}
				return
			}
			if err == nil {
				t.Fatal("gate passed")
			}
			if !errors.Is(g.refused(), controlplane.ErrUnverifiedPeer) {
				t.Errorf("refusal %v, want ErrUnverifiedPeer", g.refused())
			}
			if len(req.GetToken()) != 0 {
				t.Fatal("token placed in the body of a refused request")
			}
		})
	}
}

// A refusal on a later connection does not take back a token that already
// went to a verified one, and keeps the first reason.
func TestTokenGateKeepsFirstRefusal(t *testing.T) {
	req := &identitypb.CertifyRequest{}
	g := &tokenGate{serverName: testServerName, token: []byte("secret"), req: req}
	bad := credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{AuthInfo: tlsInfo(t, "one.example")})
	worse := credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{})
	if _, err := g.GetRequestMetadata(bad); err == nil {
		t.Fatal("passed")
	}
	first := g.refused()
	if _, err := g.GetRequestMetadata(worse); err == nil {
		t.Fatal("passed")
	}
	if g.refused() != first {
		t.Errorf("refusal changed from %v to %v", first, g.refused())
	}
}
