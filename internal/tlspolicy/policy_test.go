package tlspolicy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/fips140"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serverCert is a self-signed P-256 certificate for 127.0.0.1.
func serverCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "policy test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// handshake runs one TLS handshake over loopback TCP between a server
// configured by srv and a client with policy p applied, and returns the
// client's connection state or the handshake error.
func handshake(t *testing.T, cert tls.Certificate, srv func(*tls.Config), p Policy) (tls.ConnectionState, error) {
	t.Helper()
	sc := &tls.Config{Certificates: []tls.Certificate{cert}}
	srv(sc)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake()
	}()
	cc := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the handshake's parameters are tested, not the peer
	Apply(cc, p)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cc)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.ConnectionState(), nil
}

// TestPoliciesRefuseWhatTheyDisallow: a server that offers only what a
// policy disallows (a TLS version, a cipher suite, a key exchange) fails
// the handshake; one that offers what it allows succeeds with it.
func TestPoliciesRefuseWhatTheyDisallow(t *testing.T) {
	cert := serverCert(t)
	tls12 := func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12 }
	for _, tt := range []struct {
		name   string
		policy Policy
		server func(*tls.Config)
		ok     bool
		check  func(tls.ConnectionState) bool
	}{
		{"fips-140-2 vs TLS 1.3 only", FIPS1402, func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }, false, nil},
		{"fips-140-2 vs ChaCha20 only", FIPS1402, func(c *tls.Config) {
			tls12(c)
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}
		}, false, nil},
		{"fips-140-2 vs X25519 only", FIPS1402, func(c *tls.Config) { tls12(c); c.CurvePreferences = []tls.CurveID{tls.X25519} }, false, nil},
		{"fips-140-2 vs P-384 only", FIPS1402, func(c *tls.Config) { tls12(c); c.CurvePreferences = []tls.CurveID{tls.CurveP384} }, false, nil},
		{"fips-140-2 vs a default server", FIPS1402, func(*tls.Config) {}, true, func(cs tls.ConnectionState) bool {
			return cs.Version == tls.VersionTLS12 && cs.CipherSuite == tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 && cs.CurveID == tls.CurveP256
		}},
		{"fips-140-3 vs ChaCha20 only", FIPS1403, func(c *tls.Config) {
			tls12(c)
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}
		}, false, nil},
		{"fips-140-3 vs X25519 only", FIPS1403, func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.X25519, tls.X25519MLKEM768} }, false, nil},
		{"fips-140-3 vs TLS 1.1", FIPS1403, func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS10, tls.VersionTLS11 }, false, nil},
		{"fips-140-3 vs a default server", FIPS1403, func(*tls.Config) {}, true, func(cs tls.ConnectionState) bool {
			return cs.Version == tls.VersionTLS13 && (cs.CurveID == tls.CurveP256 || cs.CurveID == tls.CurveP384)
		}},
		{"pqc vs TLS 1.2 only", PQC, tls12, false, nil},
		{"pqc vs classical key exchange only", PQC, func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256} }, false, nil},
		{"pqc vs a default server", PQC, func(*tls.Config) {}, true, func(cs tls.ConnectionState) bool {
			return cs.Version == tls.VersionTLS13 && cs.CurveID == tls.X25519MLKEM768
		}},
		{"no policy vs X25519 only", None, func(c *tls.Config) { c.CurvePreferences = []tls.CurveID{tls.X25519} }, true, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs, err := handshake(t, cert, tt.server, tt.policy)
			switch {
			case tt.ok && err != nil:
				t.Fatalf("handshake failed: %v", err)
			case !tt.ok && err == nil:
				t.Fatalf("handshake succeeded: version %x suite %s curve %s", cs.Version, tls.CipherSuiteName(cs.CipherSuite), cs.CurveID)
			case tt.check != nil && !tt.check(cs):
				t.Errorf("version %x suite %s curve %s", cs.Version, tls.CipherSuiteName(cs.CipherSuite), cs.CurveID)
			}
		})
	}
}

func TestModuleNamesTheMode(t *testing.T) {
	if m := Module(); m == "" || Check(FIPS1402) != "" || Check(None) != "" {
		t.Errorf("Module %q, Check(fips-140-2) %q", m, Check(FIPS1402))
	}
}

// TestFIPS1403KeepsTLS13ToTheFIPSSuites: Go's client offers ChaCha20-Poly1305
// in TLS 1.3 whatever tls.Config says (outside FIPS 140-3 mode), and a server
// may choose it. A TLS 1.3 server that takes nothing else (OpenSSL's
// s_server: Go's server cannot be restricted so) is refused under
// fips-140-3; one that takes an AES-GCM suite is not; with no policy the
// ChaCha20 server is accepted.
func TestFIPS1403KeepsTLS13ToTheFIPSSuites(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("no openssl to serve a TLS 1.3 suite of its choice")
	}
	cert := serverCert(t)
	dir := t.TempDir()
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		suite  string
		policy Policy
		want   uint16 // 0: refused
	}{
		{"TLS_CHACHA20_POLY1305_SHA256", FIPS1403, 0},
		{"TLS_AES_256_GCM_SHA384", FIPS1403, tls.TLS_AES_256_GCM_SHA384},
		{"TLS_AES_128_GCM_SHA256", FIPS1403, tls.TLS_AES_128_GCM_SHA256},
		{"TLS_CHACHA20_POLY1305_SHA256", None, tls.TLS_CHACHA20_POLY1305_SHA256},
	} {
		t.Run(string(tt.policy)+" vs "+tt.suite, func(t *testing.T) {
			if tt.policy == None && fips140.Enabled() {
				t.Skip("FIPS 140-3 mode offers no ChaCha20, whatever the policy")
			}
			addr := opensslServer(t, openssl, certPath, keyPath, tt.suite)
			cc := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the handshake's parameters are tested, not the peer
			Apply(cc, tt.policy)
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cc)
			if tt.want == 0 {
				if err == nil {
					cs := conn.ConnectionState()
					conn.Close()
					t.Fatalf("handshake succeeded with %s", tls.CipherSuiteName(cs.CipherSuite))
				}
				// Outside FIPS mode the client offered the suite and
				// refused the server's choice; in it, it never offered it.
				if !fips140.Enabled() && !strings.Contains(err.Error(), "TLS_CHACHA20_POLY1305_SHA256") {
					t.Fatalf("handshake: %v, want the policy's refusal naming the suite", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer conn.Close()
			if cs := conn.ConnectionState(); cs.Version != tls.VersionTLS13 || cs.CipherSuite != tt.want {
				t.Errorf("version %x suite %s, want TLS 1.3 with %s", cs.Version, tls.CipherSuiteName(cs.CipherSuite), tls.CipherSuiteName(tt.want))
			}
		})
	}
}

// opensslServer starts `openssl s_server` on 127.0.0.1, TLS 1.3 with suite
// alone, for one connection, and returns its address.
func opensslServer(t *testing.T, openssl, certPath, keyPath, suite string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	cmd := exec.CommandContext(ctx, openssl, "s_server", "-accept", "127.0.0.1:0", "-cert", certPath, "-key", keyPath,
		"-tls1_3", "-ciphersuites", suite, "-naccept", "1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// s_server ends the connection when its stdin ends: held open.
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ACCEPT "); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return addr
		}
	}
	t.Fatalf("openssl s_server printed no ACCEPT line: %v", sc.Err())
	return ""
}
