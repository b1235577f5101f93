package test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/istioca"
)

// SECRET_GRACE_PERIOD_RATIO=1 with no jitter asks for renewal at once; the
// renewal floor (1 % of the life, at least 5 s after the certificate
// arrived) keeps the agent from asking the CA in a loop. Renewal still
// happens: two renewals of a 10 s certificate arrive, each issued at least
// the floor after the one before (by the CA's own clock, in the
// certificates), each after one CSR or a handful, not thousands.
func TestGraceRatioOneDoesNotLoop(t *testing.T) {
	const floor = 5 * time.Second
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := filepath.Join(dir, "root-cert.pem")
	flWrite(t, rootPath, ca.RootPEM())
	p := agentproc.Start(t, dir, vmEnv(ca, dir, "CA_ROOT_CA="+rootPath,
		"SECRET_GRACE_PERIOD_RATIO=1", "SECRET_GRACE_PERIOD_RATIO_JITTER=0", "SECRET_TTL=10s")...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName)
	seen := map[string]bool{}
	prev := vmNextLeaf(t, s, 15*time.Second, seen)
	for i := range 2 {
		before := ca.Requests()
		leaf := vmNextLeaf(t, s, 15*time.Second, seen)
		if n := ca.Requests() - before; n < 1 || n > 3 {
			t.Fatalf("renewal %d took %d CSRs, want one (a retry or two at most)", i+1, n)
		}
		// x509 times are whole seconds: allow one.
		if gap := leaf.NotBefore.Sub(prev.NotBefore); gap < floor-time.Second {
			t.Fatalf("renewal %d issued %v after the certificate before, want the %v floor", i+1, gap, floor)
		}
		prev = leaf
	}
	select {
	case <-p.Done():
		t.Fatal("the agent exited")
	default:
	}
}

// SECRET_GRACE_PERIOD_RATIO=0 would renew only after expiry: refused at
// start-up with exit 2 and a line saying what is accepted.
func TestGraceRatioZeroRefused(t *testing.T) {
	heavy.Skip(t, "runs the built agent")
	bin, err := agentproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := agentproc.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run")
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "SECRET_GRACE_PERIOD_RATIO=0"}, flEnv()...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want code 2; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), `SECRET_GRACE_PERIOD_RATIO="0"`) || !strings.Contains(string(out), "greater than 0") {
		t.Fatalf("the refusal does not name the setting and what is accepted:\n%s", out)
	}
}

// With the CA down and no workload certificate, a stream holding default
// and ROOTCA still gets ROOTCA, and a root change is pushed to it: a root
// never waits for a workload certificate.
func TestRootsServedWhileCertificateUnavailable(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	ca.SetMode(istioca.ModeError)
	ca.SetError(codes.Unavailable)
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := filepath.Join(dir, "roots", "root-cert.pem")
	flWrite(t, rootPath, ca.RootPEM())
	p := agentproc.Start(t, dir, vmEnv(ca, dir, "CA_ROOT_CA="+rootPath)...)
	s := flStream(t, p.Socket(), secretmanager.WorkloadCertName, secretmanager.RootCertName)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("no response while the CA is down: %v", err)
	}
	if got, ok := r.TrustedCA(secretmanager.RootCertName); !ok || !bytes.Equal(got, ca.RootPEM()) || len(r.Names) != 1 {
		t.Fatalf("first response holds %v, want ROOTCA alone with the CA root", r.Names)
	}

	bundle := append(append([]byte{}, ca.RootPEM()...), flCA(t).RootPEM()...)
	flRename(t, rootPath, bundle)
	ctx2, cancel2 := context.WithTimeout(context.Background(), flDebounce+5*time.Second)
	defer cancel2()
	for {
		r, err := s.Next(ctx2)
		if err != nil {
			t.Fatalf("the root change was not pushed while the certificate is unavailable: %v", err)
		}
		if _, _, ok := r.Cert(secretmanager.WorkloadCertName); ok {
			t.Fatal("a workload certificate was served while the CA refuses every request")
		}
		if got, ok := r.TrustedCA(secretmanager.RootCertName); ok && bytes.Equal(got, bundle) {
			break
		}
	}
	if ca.Requests() == 0 {
		t.Fatal("the agent never asked the CA")
	}
}
