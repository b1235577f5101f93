// Package testca is what the test CAs of test/istioca and test/linkerdca
// share: a gRPC server on a loopback address that can be stopped and
// served again there (test/loopback), presenting a serving certificate of
// the CA that can be replaced between handshakes, an answer delay, and a
// foreign CA for answers from a root the client does not trust. What a CA
// asks of its callers and answers them stays in its own package.
package testca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/test/loopback"
)

// Config describes the shared part of a test CA.
type Config struct {
	// Name prefixes failures and names the foreign CA ("istioca").
	Name string
	// CA signs the serving certificate. Required.
	CA *localca.CA
	// ServerNames are the DNS SANs of the serving certificate (which also
	// carries 127.0.0.1 and ::1). Required.
	ServerNames []string
	// Addr to listen on. Default "127.0.0.1:0".
	Addr string
	// Plaintext serves without TLS.
	Plaintext bool
	// VerifyClientCerts asks for a client certificate and verifies one that
	// is given against CA.
	VerifyClientCerts bool
	// Now is the foreign CA's clock. Default time.Now.
	Now func() time.Time
	// Register registers the CA's service on each new gRPC server (at
	// Serve and at every Restart).
	Register func(*grpc.Server)
	// ServerTLS, when set, changes the server's TLS configuration (the
	// versions, suites and key exchanges it offers).
	ServerTLS func(*tls.Config)
}

// Endpoint is a running test CA's network side. Its methods are safe for
// concurrent use.
type Endpoint struct {
	cfg  Config
	grpc *loopback.GRPC

	mu      sync.Mutex
	serving tls.Certificate
	delay   time.Duration
	foreign *localca.CA
}

// Serve issues the serving certificate, listens on cfg.Addr and serves
// until the test ends (or Stop).
func Serve(t testing.TB, cfg Config) *Endpoint {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Endpoint{cfg: cfg}
	serving, err := e.ServingCert(cfg.ServerNames...)
	if err != nil {
		t.Fatalf("%s: %v", cfg.Name, err)
	}
	e.serving = serving
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		t.Fatalf("%s: listening on %s: %v", cfg.Name, cfg.Addr, err)
	}
	e.grpc = loopback.ServeGRPC(cfg.Name, lis, e.newGRPC)
	t.Cleanup(e.Stop)
	return e
}

// newGRPC makes the gRPC server, at Serve and at every Restart.
func (e *Endpoint) newGRPC() *grpc.Server {
	var opts []grpc.ServerOption
	if !e.cfg.Plaintext {
		tc := &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				e.mu.Lock()
				defer e.mu.Unlock()
				c := e.serving
				return &c, nil
			},
		}
		if e.cfg.VerifyClientCerts {
			tc.ClientAuth, tc.ClientCAs = tls.VerifyClientCertIfGiven, e.cfg.CA.Pool()
		}
		if e.cfg.ServerTLS != nil {
			e.cfg.ServerTLS(tc)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	srv := grpc.NewServer(opts...)
	e.cfg.Register(srv)
	return srv
}

// Addr is the host:port served; it stays the same across Restart.
func (e *Endpoint) Addr() string { return e.grpc.Addr() }

// ServerName is the first DNS name of the default serving certificate.
func (e *Endpoint) ServerName() string { return e.cfg.ServerNames[0] }

// RootPEM is the CA root in PEM.
func (e *Endpoint) RootPEM() []byte { return e.cfg.CA.RootPEM() }

// Roots is a pool holding the CA root.
func (e *Endpoint) Roots() *x509.CertPool { return e.cfg.CA.Pool() }

// CA is the signing CA.
func (e *Endpoint) CA() *localca.CA { return e.cfg.CA }

// Stop closes the listener and every connection; new connections are
// refused until Restart. It is safe to call more than once.
func (e *Endpoint) Stop() { e.grpc.Stop() }

// Restart listens again on the same address. A running server is stopped
// first.
func (e *Endpoint) Restart(t testing.TB) {
	t.Helper()
	e.grpc.Restart(t)
}

// ServingCert issues a serving certificate from the CA for dnsNames (plus
// 127.0.0.1 and ::1), valid in real time (TLS peers check it so), for
// SetServingCert.
func (e *Endpoint) ServingCert(dnsNames ...string) (tls.Certificate, error) {
	now := time.Now()
	c, err := e.cfg.CA.TLSCertificate(localca.Leaf{
		DNSNames:  dnsNames,
		IPs:       []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(365 * 24 * time.Hour),
	})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issuing serving certificate: %w", err)
	}
	return c, nil
}

// SetServingCert replaces the certificate presented from the next
// handshake on.
func (e *Endpoint) SetServingCert(c tls.Certificate) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.serving = c
}

// SetDelay makes every answer wait d first (or until the caller gives up).
func (e *Endpoint) SetDelay(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.delay = d
}

// Delay is the wait SetDelay set, for a request's answer to take when it
// arrives.
func (e *Endpoint) Delay() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.delay
}

// Wait waits d, or fails with the gRPC status of ctx's end when that comes
// first.
func Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-t.C:
		return nil
	}
}

// ForeignCA is a CA (with an intermediate) whose root the clients do not
// trust, made at the first call.
func (e *Endpoint) ForeignCA() (*localca.CA, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.foreign == nil {
		f, err := localca.New(localca.Config{Name: e.cfg.Name + " foreign root", Intermediate: true, Now: e.cfg.Now})
		if err != nil {
			return nil, fmt.Errorf("creating foreign CA: %w", err)
		}
		e.foreign = f
	}
	return e.foreign, nil
}
