package certfile

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/pki"
)

// Bundle is a set of trust roots.
type Bundle struct {
	// Certs are the roots in file order.
	Certs []*x509.Certificate
	// PEM is Certs re-encoded as PEM.
	PEM []byte
}

// Equal reports whether b and o hold the same certificates in the same order.
func (b *Bundle) Equal(o *Bundle) bool {
	if b == nil || o == nil {
		return b == o
	}
	return bytes.Equal(b.PEM, o.PEM)
}

// Pool returns a new pool holding the roots.
func (b *Bundle) Pool() *x509.CertPool { return pki.CertPool(b.Certs) }

// NotAfter returns the earliest expiry among the roots.
func (b *Bundle) NotAfter() time.Time {
	var t time.Time
	for _, c := range b.Certs {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

func newBundle(certs []*x509.Certificate) *Bundle {
	return &Bundle{Certs: certs, PEM: pki.EncodeCertificates(certs)}
}

// ParseBundle parses a PEM bundle of one or more certificates. It is strict:
// any data that is not a CERTIFICATE block, or a block that does not parse,
// is an error, so a truncated file is never taken for a smaller bundle.
func ParseBundle(data []byte) (*Bundle, error) {
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	return newBundle(certs), nil
}

// LoadBundle reads and parses a root bundle file (see ParseBundle).
func LoadBundle(path string) (*Bundle, error) {
	data, err := regularfile.Read(path, 0)
	if err != nil {
		return nil, fmt.Errorf("reading root bundle: %w", err)
	}
	b, err := ParseBundle(data)
	if err != nil {
		return nil, fmt.Errorf("root bundle %s: %w", path, err)
	}
	return b, nil
}

// SystemBundleFiles are the places operating systems keep their PEM root
// bundle, tried in order (the same list crypto/x509 uses on Linux).
var SystemBundleFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Gentoo, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine, macOS
}

// ErrNoSystemBundle is returned when no system root bundle file is found.
var ErrNoSystemBundle = errors.New("no system root bundle found")

// SystemBundlePath returns the system root bundle file: $SSL_CERT_FILE when
// set, else the first of SystemBundleFiles that exists.
func SystemBundlePath() (string, error) {
	if p := os.Getenv("SSL_CERT_FILE"); p != "" {
		return p, nil
	}
	for _, p := range SystemBundleFiles {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w (set SSL_CERT_FILE or install ca-certificates)", ErrNoSystemBundle)
}

// LoadSystemBundle reads the system root bundle at path (from
// SystemBundlePath). Unlike LoadBundle it is lenient, as crypto/x509 is with
// the same files: text between blocks, non-certificate blocks and
// certificates Go cannot parse are skipped. At least one root must remain.
func LoadSystemBundle(path string) (*Bundle, error) {
	data, err := regularfile.Read(path, 0)
	if err != nil {
		return nil, fmt.Errorf("reading system root bundle: %w", err)
	}
	b, err := parseLenient(data)
	if err != nil {
		return nil, fmt.Errorf("system root bundle %s: %w", path, err)
	}
	return b, nil
}

func parseLenient(data []byte) (*Bundle, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, pki.ErrNoCertificates
	}
	return newBundle(certs), nil
}

// Reason returns a short, metric-label-safe name for a load error:
// "missing", "not_regular", "too_large" or "unreadable" for file errors,
// else pki.Reason's names.
func Reason(err error) string {
	var pe *fs.PathError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fs.ErrNotExist):
		return "missing"
	case errors.Is(err, regularfile.ErrNotRegular):
		return "not_regular"
	case errors.Is(err, regularfile.ErrTooLarge):
		return "too_large"
	case errors.As(err, &pe):
		return "unreadable"
	}
	return pki.Reason(err)
}
