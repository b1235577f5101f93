package brokerapi

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/tlspolicy"
	"github.com/meshagent/meshagent/secretmanager"
)

// TLSConfig is the endpoint's TLS: the agent's own X.509-SVID, read from
// the cache at each handshake (a rotation needs no restart), and a client
// certificate required and verified as an X.509-SVID of the agent's trust
// domain against the bundle the cache holds at that handshake. Which
// broker it is, and what it may do, is decided per call (authorize), so
// that a peer that is no broker hears PermissionDenied, as the standard
// says, rather than a failed handshake.
func (s *Server) TLSConfig() *tls.Config {
	tc := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequireAnyClientCert,
		GetCertificate: s.ownCertificate,
		// The chain is verified in VerifyConnection, against the roots of
		// the moment.
		VerifyConnection: s.verifyPeer,
	}
	tlspolicy.Apply(tc, s.cfg.Policy)
	return tc
}

// ownCertificate is the agent's own certificate, waiting for the first one
// while the handshake lasts.
func (s *Server) ownCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	sec, err := s.cfg.Secrets.Secret(hello.Context(), pki.Identity{}, secretmanager.WorkloadCertName)
	if err != nil {
		return nil, fmt.Errorf("the agent's own certificate: %w", err)
	}
	return s.certs.get(sec)
}

// verifyPeer verifies the client's chain as an X.509-SVID of the agent's
// trust domain, against the current bundle.
func (s *Server) verifyPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("broker API: the client presented no certificate")
	}
	td, err := s.trustDomain()
	if err != nil {
		return err
	}
	roots, err := s.cfg.Secrets.Current(pki.Identity{}, secretmanager.RootCertName)
	if err != nil {
		return fmt.Errorf("broker API: no trust bundle to verify the client: %w", err)
	}
	bundle := x509bundle.FromX509Authorities(td, roots.Bundle.Certs())
	if _, _, err := x509svid.Verify(cs.PeerCertificates, bundle); err != nil {
		return fmt.Errorf("broker API: the client's certificate is not an X.509-SVID of %s: %w", td, err)
	}
	return nil
}

// trustDomain is the trust domain of the agent's own identity.
func (s *Server) trustDomain() (spiffeid.TrustDomain, error) {
	own, err := s.cfg.Secrets.Current(pki.Identity{}, secretmanager.WorkloadCertName)
	if err != nil {
		return spiffeid.TrustDomain{}, fmt.Errorf("broker API: the agent has no certificate yet: %w", err)
	}
	id, err := spiffeid.FromString(own.Identity.SPIFFEID)
	if err != nil {
		return spiffeid.TrustDomain{}, fmt.Errorf("broker API: the agent's identity %q is not a SPIFFE ID", own.Identity.String())
	}
	return id.TrustDomain(), nil
}

// certCache keeps the tls.Certificate of the latest own secret, so a
// handshake parses the PEM only after a rotation.
type certCache struct {
	mu      sync.Mutex
	version uint64
	cert    *tls.Certificate
}

func (c *certCache) get(sec *secretmanager.Secret) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && c.version == sec.Version {
		return c.cert, nil
	}
	cert, err := tls.X509KeyPair(sec.CertChain, sec.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("the agent's own certificate: %w", err)
	}
	c.cert, c.version = &cert, sec.Version
	return c.cert, nil
}
