package test

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/outputcerts"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

var vmSA = istioca.ServiceAccount{Namespace: "vm", Name: "app"}

const vmToken = "token-vm-app"

// vmEnv is the environment of a CA-mode agent against ca.
func vmEnv(ca *istioca.Server, dir string, extra ...string) []string {
	return flEnv(append([]string{
		"CA_ADDR=" + ca.Addr(),
		"ISTIOD_SAN=" + istioca.DefaultServerName,
		"POD_NAMESPACE=" + vmSA.Namespace,
		"SERVICE_ACCOUNT=" + vmSA.Name,
		"POD_NAME=vm-1",
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(dir, "istio-token"),
		"SECRET_GRACE_PERIOD_RATIO_JITTER=0",
	}, extra...)...)
}

func vmWriteToken(t *testing.T, dir string) {
	t.Helper()
	flWrite(t, filepath.Join(dir, "istio-token"), []byte(vmToken))
}

// vmLeaf parses the leaf of name in r.
func vmLeaf(t *testing.T, r *sdsclient.Response, name string) *x509.Certificate {
	t.Helper()
	chain, _, ok := r.Cert(name)
	if !ok {
		return nil
	}
	certs, err := pki.ParseCertificates(chain)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return certs[0]
}

// vmNextLeaf waits for a response carrying a default certificate whose
// serial is not in seen.
func vmNextLeaf(t *testing.T, s *sdsclient.Stream, within time.Duration, seen map[string]bool) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("no new workload certificate within %v: %v", within, err)
		}
		if l := vmLeaf(t, r, secretmanager.WorkloadCertName); l != nil && !seen[l.SerialNumber.String()] {
			seen[l.SerialNumber.String()] = true
			return l
		}
	}
}

// CA mode: a CA serving certificate from a new root is refused until the
// CA_ROOT_CA bundle holds old and new roots; the bundle change reaches ROOTCA
// subscribers and the next connection to the CA is accepted.
func TestCARootRotation(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := filepath.Join(dir, "roots", "root-cert.pem")
	flWrite(t, rootPath, ca.RootPEM())
	p := agentproc.Start(t, dir, vmEnv(ca, dir, "CA_ROOT_CA="+rootPath, "SECRET_TTL=4s")...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, secretmanager.RootCertName)
	seen := map[string]bool{}
	vmNextLeaf(t, s, 15*time.Second, seen)

	// The CA now presents a certificate from a root the agent does not trust.
	newRoot := flCA(t)
	serving, err := newRoot.ServerTLS([]string{istioca.DefaultServerName}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	ca.SetServingCert(serving)
	ca.Restart(t)
	before := ca.Requests()
	// Renewal is due within 2 s and fails at the handshake: wait for the
	// agent to report a failed request.
	logged := len(p.Logs())
	testwait.Within(t, 10*time.Second, "the agent to report a failed request to a CA with an untrusted certificate", func() bool {
		return strings.Contains(p.Logs()[logged:], "certificate request failed")
	})
	if !strings.Contains(p.Logs()[logged:], "x509") {
		t.Error("the failed request does not name a certificate verification error")
	}
	if got := ca.Requests(); got != before {
		t.Fatalf("the CA received %d requests over a connection the agent should have refused", got-before)
	}

	bundle := append(append([]byte{}, ca.RootPEM()...), newRoot.RootPEM()...)
	flRename(t, rootPath, bundle)
	ctx, cancel := context.WithTimeout(context.Background(), flDebounce+time.Second)
	defer cancel()
	for {
		r, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("ROOTCA did not change to the two-root bundle: %v", err)
		}
		if got, ok := r.TrustedCA(secretmanager.RootCertName); ok && bytes.Equal(got, bundle) {
			break
		}
	}
	vmNextLeaf(t, s, 15*time.Second, seen)
	if ca.Requests() == before {
		t.Fatal("a new certificate was served without a request to the CA")
	}
}

// OUTPUT_CERTS: the files are written (key 0600), and an agent restarted
// while the CA is down serves the certificate found there.
func TestOutputCertsServedAfterRestart(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := filepath.Join(dir, "root-cert.pem")
	flWrite(t, rootPath, ca.RootPEM())
	out := filepath.Join(dir, "out")
	env := vmEnv(ca, dir, "CA_ROOT_CA="+rootPath, "SECRET_TTL=1h", "OUTPUT_CERTS="+out)
	p := agentproc.Start(t, dir, env...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
	leaf := vmNextLeaf(t, s, 15*time.Second, map[string]bool{})

	var fileLeaf *x509.Certificate
	testwait.Within(t, 5*time.Second, "OUTPUT_CERTS to hold the served certificate", func() bool {
		pair, err := outputcerts.Load(out, ca.Identity(vmSA), time.Now())
		if err != nil {
			return false
		}
		fileLeaf = pair.Leaf()
		return fileLeaf.SerialNumber.Cmp(leaf.SerialNumber) == 0
	})
	st, err := os.Stat(filepath.Join(out, files.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", st.Mode().Perm())
	}
	if b, err := os.ReadFile(filepath.Join(out, files.RootCertFile)); err != nil || !bytes.Equal(b, ca.RootPEM()) {
		t.Errorf("root-cert.pem: %v", err)
	}

	p.Stop()
	ca.Stop()
	requests := ca.Requests()
	p2 := agentproc.Start(t, dir, env...)
	s2 := flStream(t, p2.Socket(), secretmanager.WorkloadCertName)
	got := vmNextLeaf(t, s2, 15*time.Second, map[string]bool{})
	if got.SerialNumber.Cmp(fileLeaf.SerialNumber) != 0 {
		t.Fatalf("restarted agent served serial %x, OUTPUT_CERTS holds %x", got.SerialNumber, fileLeaf.SerialNumber)
	}
	if ca.Requests() != requests {
		t.Fatal("the CA was asked although it is down")
	}
}

// VM flow: PROV_CERT is the OUTPUT_CERTS directory and there is no token;
// the agent renews over mTLS with the previous certificate three times in
// a row.
func TestVMRenewsOverMTLS(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{})
	dir := agentproc.TempDir(t)
	out := filepath.Join(dir, "etc", "certs")
	const ttl = 3 * time.Second
	// The provisioned certificate lives longer, so it is still the one held
	// when the stream opens (renewal at half its lifetime).
	chain, key := flIssue(t, ca.CA(), ca.Identity(vmSA), 8*time.Second)
	flWrite(t, filepath.Join(out, files.CertChainFile), chain)
	flWrite(t, filepath.Join(out, files.KeyFile), key)
	flWrite(t, filepath.Join(out, files.RootCertFile), ca.RootPEM())

	p := agentproc.Start(t, dir, vmEnv(ca, dir, "PROV_CERT="+out, "OUTPUT_CERTS="+out, "SECRET_TTL="+ttl.String())...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
	seen := map[string]bool{}
	provisioned, err := pki.ParseCertificates(chain)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ { // the provisioned certificate, then three renewals
		leaf := vmNextLeaf(t, s, 10*time.Second, seen)
		if i == 0 && leaf.SerialNumber.Cmp(provisioned[0].SerialNumber) != 0 {
			t.Errorf("first served serial %x, want the provisioned %x", leaf.SerialNumber, provisioned[0].SerialNumber)
		}
		t.Logf("served serial %x, valid until %v", leaf.SerialNumber, leaf.NotAfter.Format(time.RFC3339Nano))
	}
	if got := ca.Requests(); got < 3 {
		t.Errorf("CA received %d requests, want at least 3", got)
	}
	if toks := ca.Tokens(); len(toks) != 0 {
		t.Errorf("CA saw bearer tokens %q; the VM flow has none", toks)
	}
}

// OUTPUT_CERTS is the agent's to keep, from outside input: the temporary key
// files a write cut short left are removed when the agent starts writing, and
// a reload pid file that names the agent itself is refused (logged) on every
// rotation, without the agent signalling, and so ending, itself.
func TestOutputCertsStaleTempsAndSelfPIDFile(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := filepath.Join(dir, "root-cert.pem")
	flWrite(t, rootPath, ca.RootPEM())
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(out, ".key.pem.tmp-123456")
	flWrite(t, stale, []byte("-----BEGIN PRIVATE KEY-----\nstale\n-----END PRIVATE KEY-----\n"))
	pidFile := filepath.Join(dir, "app.pid")
	p := agentproc.Start(t, dir, vmEnv(ca, dir, "CA_ROOT_CA="+rootPath, "SECRET_TTL=4s", "OUTPUT_CERTS="+out,
		"MESHAGENT_OUTPUT_CERTS_RELOAD_PID_FILE="+pidFile)...)
	waitFor(t, "the first OUTPUT_CERTS write", func() bool {
		_, err := outputcerts.Load(out, ca.Identity(vmSA), time.Now())
		return err == nil
	})
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale temporary key file is still there: %v", err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(p.Pid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a rotation's reload hook refusing the agent's own pid", func() bool {
		if p.ExitCode() >= 0 {
			t.Fatalf("the agent exited with %d: it signalled itself\n%s", p.ExitCode(), p.Logs())
		}
		return strings.Contains(p.Logs(), "names the agent itself")
	})
	if code := p.ExitCode(); code >= 0 {
		t.Fatalf("the agent exited with %d", code)
	}
}
