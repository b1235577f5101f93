package trust

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"go.uber.org/zap"

	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// CRL is a file of certificate revocation lists as served in ROOTCA's
// validation context: one or more PEM "X509 CRL" blocks, each of which
// parsed. The zero value (no PEM) is "no CRL". Immutable once made.
type CRL struct {
	// PEM is the lists re-encoded, nil for none.
	PEM []byte
	// Lists are the parsed lists, in file order.
	Lists []*x509.RevocationList
}

// Equal reports whether c and o hold the same lists.
func (c *CRL) Equal(o *CRL) bool {
	if c == nil || o == nil {
		return c == o
	}
	return bytes.Equal(c.PEM, o.PEM)
}

// ErrNotCRL is the error of data that is not a CRL file.
var ErrNotCRL = errors.New("not a PEM CRL")

// ParseCRL parses a CRL file: one or more PEM "X509 CRL" blocks, with
// nothing else but white space. Any other block, text outside the blocks or
// a list that does not parse is an error, so a truncated file is never
// taken for fewer lists. The signatures are not checked: the CRL is handed
// as it is to the proxy, which checks it against its trusted CAs.
func ParseCRL(data []byte) (*CRL, error) {
	out := &CRL{}
	rest := bytes.TrimSpace(data)
	if len(rest) == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrNotCRL)
	}
	for i := 0; len(rest) > 0; i++ {
		block, r := pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: list %d: data is not PEM", ErrNotCRL, i)
		}
		if block.Type != "X509 CRL" {
			return nil, fmt.Errorf("%w: list %d: PEM block type %q, want X509 CRL", ErrNotCRL, i, block.Type)
		}
		l, err := x509.ParseRevocationList(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: list %d: %w", ErrNotCRL, i, err)
		}
		out.Lists = append(out.Lists, l)
		out.PEM = append(out.PEM, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: block.Bytes})...)
		rest = bytes.TrimSpace(r)
	}
	return out, nil
}

// LoadCRL reads and parses the CRL file at path. A file that does not exist
// is no CRL (the zero CRL), not an error: the file is optional, as
// istiod's istio-ca-crl ConfigMap is.
func LoadCRL(path string) (*CRL, error) {
	data, err := regularfile.Read(path, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return &CRL{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the CRL file: %w", err)
	}
	c, err := ParseCRL(data)
	if err != nil {
		return nil, fmt.Errorf("CRL file %s: %w", path, err)
	}
	return c, nil
}

// CRLSetter takes the CRL served with the trust bundle (nil: none).
// *secretmanager.Roots is one.
type CRLSetter interface {
	SetCRL(pemData []byte)
}

// CRLFeedConfig configures a CRLFeed.
type CRLFeedConfig struct {
	// Path is the CRL file. Required.
	Path string
	// Into receives every new good CRL. Required.
	Into CRLSetter
	// Source configures the watch (debounce, clock, logger, metrics).
	Source certfile.SourceConfig
}

// CRLFeed follows a CRL file into a CRLSetter: a new good file replaces the
// CRL; a file that does not parse is refused (logged and counted as a
// rejected file of kind "crl") and the last good CRL stays; a file that is
// removed means no CRL. The file is watched with the agent's file watcher
// (a Kubernetes ..data swap, a rename, an edit).
type CRLFeed struct {
	path string
	src  *certfile.Source[*CRL]
	into CRLSetter
	log  *zap.Logger
}

// NewCRLFeed checks cfg and returns the feed. It does no I/O.
func NewCRLFeed(cfg CRLFeedConfig) (*CRLFeed, error) {
	if cfg.Path == "" || cfg.Into == nil {
		return nil, errors.New("trust: a CRL feed needs a path and a setter")
	}
	src, err := certfile.NewSource(cfg.Source, cfg.Path, "crl", []string{cfg.Path}, func(time.Time) (*CRL, error) {
		return LoadCRL(cfg.Path)
	})
	if err != nil {
		return nil, err
	}
	log := cfg.Source.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &CRLFeed{path: cfg.Path, src: src, into: cfg.Into, log: log.Named("trust").With(zap.String(logkeys.Path, cfg.Path))}, nil
}

// Run watches the file and sets every new good CRL until ctx ends, and
// returns nil. Run once.
func (f *CRLFeed) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.src.Follow(ctx, func(c *CRL) {
			f.log.Info("CRL applied", zap.Int(logkeys.Lists, len(c.Lists)))
			f.into.SetCRL(c.PEM)
		})
	}()
	err := f.src.Run(ctx)
	<-done
	return err
}
