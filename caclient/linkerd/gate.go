package linkerd

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/caclient/linkerd/identitypb"
	"github.com/meshagent/meshagent/internal/controlplane"
)

// tokenGate puts the token into a request body only after the connection that
// will carry the body has been checked.
//
// It is passed as per-call credentials. gRPC calls GetRequestMetadata while it
// opens the stream on the chosen connection, with that connection's handshake
// result in the context, and marshals the request only after the stream is
// open. So the token enters the body after, and only if, the check passed on
// the connection that sends it; when the check fails the stream is never
// opened and nothing of the request leaves the process. A retry on another
// connection runs the check again before the buffered body is replayed there.
type tokenGate struct {
	serverName string
	// plaintextLoopback is set for a plaintext transport to a loopback
	// address, the one case where no TLS peer is needed.
	plaintextLoopback bool
	token             []byte

	mu      sync.Mutex
	req     *identitypb.CertifyRequest
	refusal error // the first refusal, returned by Sign in place of gRPC's wrapper
}

// GetRequestMetadata checks the peer and, when it passes, fills in the token.
// It adds no metadata.
func (g *tokenGate) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if err := checkPeer(ri.AuthInfo, g.serverName, g.plaintextLoopback); err != nil {
		g.mu.Lock()
		if g.refusal == nil {
			g.refusal = err
		}
		g.mu.Unlock()
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	g.mu.Lock()
	g.req.Token = g.token
	g.mu.Unlock()
	return nil, nil
}

// RequireTransportSecurity is false: checkPeer is stricter than gRPC's check
// (a named, verified TLS peer) and also allows loopback plaintext.
func (g *tokenGate) RequireTransportSecurity() bool { return false }

func (g *tokenGate) refused() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refusal
}

// checkPeer passes a plaintext connection to a loopback address, or one whose
// TLS handshake gave a peer certificate valid for serverName. A TLS transport
// is held to its name even on loopback: loopback only excuses the absence of
// TLS, not a peer with the wrong name. The transport built by
// controlplane.Dial has already verified that certificate's chain against the
// trust anchors during the handshake (a handshake that fails that check makes
// no connection); the name is checked again here so that transport
// credentials replaced through DialOptions cannot carry the token to a peer
// with another name.
func checkPeer(auth credentials.AuthInfo, serverName string, plaintextLoopback bool) error {
	info, ok := auth.(credentials.TLSInfo)
	if !ok {
		if plaintextLoopback {
			return nil
		}
		return fmt.Errorf("%w: connection has no TLS peer", controlplane.ErrUnverifiedPeer)
	}
	if len(info.State.PeerCertificates) == 0 {
		return fmt.Errorf("%w: TLS peer presented no certificate", controlplane.ErrUnverifiedPeer)
	}
	if err := info.State.PeerCertificates[0].VerifyHostname(serverName); err != nil {
		return fmt.Errorf("%w: %v", controlplane.ErrUnverifiedPeer, err)
	}
	return nil
}
