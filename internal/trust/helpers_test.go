package trust

import (
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
)

// newRoot makes a fresh root and returns its PEM.
func newRoot(t *testing.T, name string) []byte {
	t.Helper()
	ca, err := localca.New(localca.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return ca.RootPEM()
}

// cat concatenates PEM bundles.
func cat(bundles ...[]byte) []byte {
	var out []byte
	for _, b := range bundles {
		out = append(out, b...)
	}
	return out
}

// publisher records what the merger publishes.
type publisher struct {
	mu      sync.Mutex
	sets    [][]byte
	sources []string
	changed chan struct{}
}

func newPublisher() *publisher { return &publisher{changed: make(chan struct{}, 1)} }

func (p *publisher) SetBundle(b *pki.Bundle, source string) {
	p.mu.Lock()
	p.sets = append(p.sets, b.PEM())
	p.sources = append(p.sources, source)
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sets)
}

func (p *publisher) last() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sets) == 0 {
		return nil
	}
	return p.sets[len(p.sets)-1]
}

// subjects returns the common names of a bundle's certificates, in order.
func subjects(t *testing.T, pemData []byte) []string {
	t.Helper()
	if pemData == nil {
		return nil
	}
	certs, err := pki.ParseCertificates(pemData)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = name(c)
	}
	return out
}

func name(c *x509.Certificate) string { return c.Subject.CommonName }

// eventually polls cond until it holds, for at most 30 s: the informers
// deliver the API server's changes when they arrive.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Within(t, 30*time.Second, what, cond)
}
