package certfile

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
)

func TestSystemBundleOfThisMachine(t *testing.T) {
	t.Setenv("SSL_CERT_FILE", "")
	path, err := SystemBundlePath()
	if errors.Is(err, ErrNoSystemBundle) {
		t.Skip("this machine has no system root bundle")
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadSystemBundle(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Certs()) < 10 {
		t.Fatalf("system bundle %s holds only %d roots", path, len(b.Certs()))
	}
	t.Logf("%s: %d roots", path, len(b.Certs()))
}

// LoadSystemBundle skips what crypto/x509 skips in the same files; the
// bundle is taken from SSL_CERT_FILE when it is set.
func TestSystemBundleLenient(t *testing.T) {
	a, b := newCA(t), newCA(t)
	var data bytes.Buffer
	data.WriteString("# Comment lines as in some distributions' bundles\n")
	data.Write(a.RootPEM())
	data.WriteString("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
	data.WriteString("-----BEGIN TRUSTED CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END TRUSTED CERTIFICATE-----\n")
	data.WriteString("Certificate:\n    Data: text dump\n")
	data.Write(b.RootPEM())
	data.WriteString("trailing text")
	p := filepath.Join(t.TempDir(), "bundle.pem")
	writeFile(t, p, data.Bytes())

	t.Setenv("SSL_CERT_FILE", p)
	path, err := SystemBundlePath()
	if err != nil || path != p {
		t.Fatalf("SystemBundlePath = %q, %v; want SSL_CERT_FILE %q", path, err, p)
	}
	bundle, err := LoadSystemBundle(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(bundle.Certs()) != 2 || !bundle.Certs()[0].Equal(a.Root()) || !bundle.Certs()[1].Equal(b.Root()) {
		t.Fatalf("got %d roots, want the two good ones", len(bundle.Certs()))
	}
	// The strict loader refuses the same file.
	if _, err := LoadBundle(p); err == nil {
		t.Fatal("LoadBundle accepted a bundle with junk")
	}

	writeFile(t, p, []byte("no certificates here"))
	if _, err := LoadSystemBundle(p); err == nil {
		t.Fatal("a bundle without certificates was accepted")
	}
}
