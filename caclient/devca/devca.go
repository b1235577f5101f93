package devca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshagent/meshagent/caclient"
	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// DefaultTTL is the lifetime given when a request asks for none.
const DefaultTTL = 24 * time.Hour

var (
	// ErrClosed is returned by Sign after Close.
	ErrClosed = errors.New("dev CA client is closed")
	// ErrBadCSR is wrapped by errors for a CSR the CA refuses.
	ErrBadCSR = errors.New("certificate signing request refused")
)

// Config describes a dev CA. Zero values get the defaults noted.
type Config struct {
	// CA signs the certificates. Nil means a fresh in-memory CA with an
	// intermediate, made by New.
	CA *localca.CA
	// MaxTTL caps the lifetime of issued certificates. Zero means no cap.
	MaxTTL time.Duration
}

// Client is an in-process caclient.Client backed by a localca.CA. Safe for
// concurrent use.
type Client struct {
	ca     *localca.CA
	maxTTL time.Duration

	mu       sync.Mutex
	closed   bool
	requests int
}

var _ caclient.Client = (*Client)(nil)

// New returns a client for cfg.CA, or for a fresh CA when it is nil.
func New(cfg Config) (*Client, error) {
	ca := cfg.CA
	if ca == nil {
		var err error
		ca, err = localca.New(localca.Config{Name: "meshagent dev CA", Intermediate: true})
		if err != nil {
			return nil, fmt.Errorf("dev CA: %w", err)
		}
	}
	if cfg.MaxTTL < 0 {
		return nil, fmt.Errorf("dev CA: negative maximum lifetime %s", cfg.MaxTTL)
	}
	return &Client{ca: ca, maxTTL: cfg.MaxTTL}, nil
}

// CA returns the CA that signs, for its root.
func (c *Client) CA() *localca.CA { return c.ca }

// Requests returns how many Sign calls reached the CA.
func (c *Client) Requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

// Sign checks the CSR the way a mesh CA does (valid signature; its only
// subject alternative name is exactly id; no common name other than id's DNS
// name) and issues a certificate for id with ttl (DefaultTTL when zero,
// capped at MaxTTL). The chain is leaf, intermediates, root.
func (c *Client) Sign(ctx context.Context, csrDER []byte, id pki.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.requests++
	}
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	csr, err := pki.ParseCSR(csrDER)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := checkCSR(csr, id); err != nil {
		return nil, err
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if c.maxTTL > 0 && ttl > c.maxTTL {
		ttl = c.maxTTL
	}
	chain, err := c.ca.Issue(localca.Leaf{PublicKey: csr.PublicKey, Identity: id, TTL: ttl})
	if err != nil {
		return nil, fmt.Errorf("dev CA: %w", err)
	}
	return chain, nil
}

func checkCSR(csr *x509.CertificateRequest, id pki.Identity) error {
	if len(csr.IPAddresses) != 0 || len(csr.EmailAddresses) != 0 {
		return fmt.Errorf("%w: it asks for IP addresses or email addresses", ErrBadCSR)
	}
	switch {
	case id.SPIFFEID != "":
		if len(csr.URIs) != 1 || len(csr.DNSNames) != 0 || !(pki.Identity{SPIFFEID: csr.URIs[0].String()}).Matches(id) {
			return fmt.Errorf("%w: want exactly the URI SAN %s", ErrBadCSR, id)
		}
		if csr.Subject.CommonName != "" {
			return fmt.Errorf("%w: unexpected common name %q", ErrBadCSR, csr.Subject.CommonName)
		}
	default:
		if len(csr.DNSNames) != 1 || len(csr.URIs) != 0 || csr.DNSNames[0] != id.DNSName {
			return fmt.Errorf("%w: want exactly the DNS SAN %s", ErrBadCSR, id)
		}
		if cn := csr.Subject.CommonName; cn != "" && cn != id.DNSName {
			return fmt.Errorf("%w: unexpected common name %q", ErrBadCSR, cn)
		}
	}
	return nil
}

// Close makes further Sign calls fail. It is safe to call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
