package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/meshagent/meshagent/credfetcher"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
)

// secretGetter gives the secret held now by name (secretmanager.Manager).
type secretGetter interface {
	Current(id pki.Identity, name string) (*secretmanager.Secret, error)
}

// errNoWorkloadCert: no secret source to take a client certificate from.
var errNoWorkloadCert = errors.New("no workload certificate yet")

// workloadCertificate returns the function that gives the agent's own
// workload certificate, as held by secrets now, for the TLS client
// certificate the xDS proxy presents to the control plane. It never waits:
// without a valid certificate it returns an error. Each certificate is
// parsed once. A nil secrets gives errNoWorkloadCert.
func workloadCertificate(secrets secretGetter) func() (*tls.Certificate, error) {
	type parsed struct {
		version uint64
		cert    *tls.Certificate
	}
	var last atomic.Pointer[parsed]
	return func() (*tls.Certificate, error) {
		if secrets == nil {
			return nil, errNoWorkloadCert
		}
		s, err := secrets.Current(pki.Identity{}, secretmanager.WorkloadCertName) // the agent's own
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errNoWorkloadCert, err)
		}
		if p := last.Load(); p != nil && p.version == s.Version {
			return p.cert, nil
		}
		c, err := tls.X509KeyPair(s.CertChain, s.PrivateKey)
		if err != nil {
			return nil, fmt.Errorf("workload certificate: %w", err)
		}
		last.Store(&parsed{version: s.Version, cert: &c})
		return &c, nil
	}
}

// errTokenSent: the bearer token authenticates the agent; no certificate is
// offered beside it.
var errTokenSent = errors.New("a bearer token is sent instead")

// tokenCheckTimeout bounds the token look-up of one handshake.
const tokenCheckTimeout = 2 * time.Second

// certWhenNoToken offers the workload certificate (cert) to the control plane
// only when no bearer token can be had: the token-less VM flow, where the
// certificate is how the agent is known. With a token, none is offered, as
// pilot-agent offers none on Kubernetes. istiod checks client certificates
// against a pool it builds once, at start: after a root rotation of its
// plug-in CA it refuses a certificate of the new root ("unknown certificate
// authority") until it restarts, so every new xDS connection would fail
// although the token alone is accepted (docs/istio.md).
func certWhenNoToken(tokens credfetcher.Fetcher, cert func() (*tls.Certificate, error)) func() (*tls.Certificate, error) {
	if tokens == nil {
		return cert
	}
	return func() (*tls.Certificate, error) {
		ctx, cancel := context.WithTimeout(context.Background(), tokenCheckTimeout)
		defer cancel()
		if t, err := tokens.Token(ctx); err == nil && t != "" {
			return nil, errTokenSent
		}
		return cert()
	}
}

// xdsClientCert is the certificate the xDS proxy offers the control plane.
// With PROV_CERT (a VM) it is the workload certificate whenever one is held,
// beside the token while that is valid, as pilot-agent offers PROV_CERT's:
// once the onboarding token expires the certificate is how the agent is
// known, on a connection made before the expiry too. The transport offers
// it only to a control plane that accepts its issuer (a root rotated since
// istiod started is not, and the token then speaks alone). Otherwise
// certWhenNoToken.
func (a *App) xdsClientCert(tokens credfetcher.Fetcher, cert func() (*tls.Certificate, error)) func() (*tls.Certificate, error) {
	if a.s.ProvCert != "" {
		return cert
	}
	return certWhenNoToken(tokens, cert)
}
