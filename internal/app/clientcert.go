package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"

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
