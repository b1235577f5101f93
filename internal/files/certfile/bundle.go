package certfile

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/meshagent/meshagent/internal/files/regularfile"
	"github.com/meshagent/meshagent/internal/pki"
)

// LoadBundle reads and parses a root bundle file (see pki.ParseBundle: strict,
// so a truncated file is never taken for a smaller bundle).
func LoadBundle(path string) (*pki.Bundle, error) {
	return loadBundle(nil, path)
}

// loadBundle is LoadBundle with the file opened by open (nil: by path).
func loadBundle(open func(string) (*os.File, error), path string) (*pki.Bundle, error) {
	data, err := regularfile.ReadWith(open, path, 0)
	if err != nil {
		return nil, fmt.Errorf("reading root bundle: %w", err)
	}
	b, err := pki.ParseBundle(data)
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
func LoadSystemBundle(path string) (*pki.Bundle, error) {
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

func parseLenient(data []byte) (*pki.Bundle, error) {
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
	return pki.NewBundle(certs), nil
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
