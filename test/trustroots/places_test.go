package trustroots

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// places reads the agent's roots from every place it publishes them: ROOTCA
// on an open SDS stream, the bundle on an open Workload API stream (go-spiffe's
// X509Source) and OUTPUT_CERTS' root-cert.pem; and its workload
// certificate, from the SDS stream.
type places struct {
	outRoot string
	td      spiffeid.TrustDomain

	mu       sync.Mutex
	sdsRoots []byte
	cert     *tls.Certificate
	wlRoots  []*x509.Certificate
}

// OnX509BundlesUpdate and OnX509BundlesWatchError make places a go-spiffe
// X509BundleWatcher. (go-spiffe's X509Source is not used: in v2.8.1 its
// GetX509BundleForTrustDomain reads the bundles without its lock.)
func (pl *places) OnX509BundlesUpdate(set *x509bundle.Set) {
	if b, ok := set.Get(pl.td); ok {
		pl.mu.Lock()
		pl.wlRoots = b.X509Authorities()
		pl.mu.Unlock()
	}
}

func (pl *places) OnX509BundlesWatchError(error) {}

func openPlaces(t *testing.T, p *agentproc.Proc, outDir string) *places {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pl := &places{outRoot: filepath.Join(outDir, "root-cert.pem"), td: spiffeid.RequireTrustDomainFromString("cluster.local")}
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName, secretmanager.RootCertName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	read := make(chan struct{})
	t.Cleanup(func() { <-read })
	go func() {
		defer close(read)
		for {
			var r *sdsclient.Response
			select {
			case r = <-st.Responses():
			case <-st.Done():
				return
			}
			pl.mu.Lock()
			if roots, ok := r.TrustedCA(secretmanager.RootCertName); ok {
				pl.sdsRoots = roots
			}
			if chain, key, ok := r.Cert(secretmanager.WorkloadCertName); ok {
				if c, err := tls.X509KeyPair(chain, key); err == nil {
					pl.cert = &c
				}
			}
			pl.mu.Unlock()
		}
	}()
	t.Cleanup(st.Close) // runs before the wait for the reader above
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		_ = gsworkloadapi.WatchX509Bundles(wctx, pl, gsworkloadapi.WithAddr("unix://"+p.Socket()))
	}()
	t.Cleanup(func() {
		wcancel()
		<-wdone
	})
	return pl
}

// bundles returns the roots each place holds now, by place name.
func (pl *places) bundles() map[string][]*x509.Certificate {
	out := map[string][]*x509.Certificate{}
	pl.mu.Lock()
	if certs, err := pki.ParseCertificates(pl.sdsRoots); err == nil {
		out["sds ROOTCA"] = certs
	}
	if pl.wlRoots != nil {
		out["workload api"] = pl.wlRoots
	}
	pl.mu.Unlock()
	if data, err := os.ReadFile(pl.outRoot); err == nil {
		if certs, err := pki.ParseCertificates(data); err == nil {
			out["output certs"] = certs
		}
	}
	return out
}

// workloadCert is the workload certificate last served over SDS.
func (pl *places) workloadCert() *tls.Certificate {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.cert
}

// sdsPool is the ROOTCA bundle last served over SDS, as a pool.
func (pl *places) sdsPool() *x509.CertPool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	certs, _ := pki.ParseCertificates(pl.sdsRoots)
	return pki.CertPool(certs)
}

// names returns the common names of certs, sorted.
func names(certs []*x509.Certificate) []string {
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = c.Subject.CommonName
	}
	sort.Strings(out)
	return out
}

// waitRoots waits until every place holds exactly the roots named want.
func (pl *places) waitRoots(t *testing.T, want ...string) {
	t.Helper()
	sort.Strings(want)
	testwait.Every(t, 30*time.Second, 20*time.Millisecond, fmt.Sprintf("every place to hold %v", want), func() error {
		got := pl.bundles()
		ok := len(got) == 3
		desc := map[string][]string{}
		for p, certs := range got {
			desc[p] = names(certs)
			ok = ok && slices.Equal(desc[p], want)
		}
		if !ok {
			return fmt.Errorf("the places hold %v", desc)
		}
		return nil
	})
}

// waitIssuer waits until the workload certificate served over SDS chains to
// the root named root.
func (pl *places) waitIssuer(t *testing.T, root string, within time.Duration) {
	t.Helper()
	testwait.Within(t, within, "a workload certificate under "+root, func() bool {
		c := pl.workloadCert()
		if c == nil || len(c.Certificate) == 0 {
			return false
		}
		last, err := x509.ParseCertificate(c.Certificate[len(c.Certificate)-1])
		return err == nil && (last.Issuer.CommonName == root || last.Subject.CommonName == root)
	})
}

// peer is another workload: a TLS server whose certificate the test
// switches to the new root during a rotation, and which verifies its
// clients against the agent's ROOTCA.
type peer struct {
	lis  net.Listener
	cert atomic.Pointer[tls.Certificate]
	wg   sync.WaitGroup
}

func startPeer(t *testing.T, pl *places, cert tls.Certificate) *peer {
	t.Helper()
	p := &peer{}
	p.cert.Store(&cert)
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*p.cert.Load()},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pl.sdsPool(),
			}, nil
		},
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.lis = lis
	p.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Write([]byte("ok"))
			})
		}
	})
	t.Cleanup(func() {
		_ = lis.Close()
		p.wg.Wait()
	})
	return p
}

// handshake connects to the peer as the agent's workload, verifying the
// peer with roots, and reads the peer's greeting (which fails when the peer
// refused the client certificate).
func handshake(addr string, roots []*x509.Certificate, cert *tls.Certificate) error {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		ServerName:   peerName,
		RootCAs:      pki.CertPool(roots),
		Certificates: []tls.Certificate{*cert},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading the peer's greeting: %w", err)
	}
	return nil
}

const peerName = "peer.trustroots.test"

// handshaker handshakes with the peer every 100 ms with the roots of every
// place and the workload certificate, and counts what failed.
type handshaker struct {
	stop     chan struct{}
	done     chan struct{}
	attempts atomic.Int64
	mu       sync.Mutex
	failures []error
}

func startHandshakes(pl *places, addr string) *handshaker {
	h := &handshaker{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
			cert := pl.workloadCert()
			for place, roots := range pl.bundles() {
				h.attempts.Add(1)
				if err := handshake(addr, roots, cert); err != nil {
					h.mu.Lock()
					h.failures = append(h.failures, fmt.Errorf("%s at %s: %w", place, time.Now().Format(time.StampMilli), err))
					h.mu.Unlock()
				}
			}
		}
	}()
	return h
}

// finish stops the handshakes and returns how many were made and what
// failed.
func (h *handshaker) finish() (int64, error) {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempts.Load(), errors.Join(h.failures...)
}
