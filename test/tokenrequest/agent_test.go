package tokenrequest

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/sdsclient"
	"github.com/meshagent/meshagent/test/xdsserver"
)

const (
	saName  = "web"
	podName = "web-0"
)

// setup is one test's world: a namespace with the workload's service
// account (allowed to create tokens for itself only) and its pod, a test CA
// that authenticates callers by TokenReview, and the agent's working
// directory with a kubeconfig acting as the service account and the CA root.
type setup struct {
	env *kubeenv.Env
	ns  string
	pod *corev1.Pod
	ca  *istioca.Server
	dir string
	id  pki.Identity
	kc  string // kubeconfig path
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	env := kube.Env(t)
	ctx := context.Background()
	ns := env.TestNamespace(t)
	if _, err := env.CreateServiceAccount(ctx, ns, saName); err != nil {
		t.Fatal(err)
	}
	if err := env.GrantOwnTokens(context.Background(), ns, saName); err != nil {
		t.Fatal(err)
	}
	pod, err := env.CreatePod(ctx, ns, podName, saName, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	s := &setup{env: env, ns: ns, pod: pod, dir: agentproc.TempDir(t)}
	s.ca = istioca.Start(t, istioca.Config{Kube: env.Client()})
	s.id = s.ca.Identity(istioca.ServiceAccount{Namespace: ns, Name: saName})
	// The agent's own credentials for the API server: a token of its
	// service account with the API's audience, as in a pod.
	apiTok, err := env.Token(ctx, ns, saName, nil, pod, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.kc = filepath.Join(s.dir, "kubeconfig")
	if err := env.Kubeconfig(s.kc, apiTok); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "root-cert.pem"), s.ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// start runs the agent with TokenRequest credentials and no token file.
func (s *setup) start(t *testing.T, extra ...string) *agentproc.Proc {
	t.Helper()
	env := append([]string{
		"STATUS_PORT=0",
		"MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_XDS_PROXY=false",
		"MESHAGENT_LOG_LEVEL=debug",
		"CA_ADDR=" + s.ca.Addr(),
		"ISTIOD_SAN=" + istioca.DefaultServerName,
		"CA_ROOT_CA=" + filepath.Join(s.dir, "root-cert.pem"),
		"POD_NAMESPACE=" + s.ns,
		"SERVICE_ACCOUNT=" + saName,
		"POD_NAME=" + podName,
		"POD_UID=" + string(s.pod.UID),
		"CREDENTIAL_FETCHER_TYPE=TokenRequest",
		"KUBECONFIG=" + s.kc,
		"MESHAGENT_TOKEN_LIFETIME=10m",
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(s.dir, "no-such-token"),
		"SECRET_GRACE_PERIOD_RATIO_JITTER=0",
	}, extra...)
	return agentproc.Start(t, s.dir, env...)
}

func stream(t *testing.T, p *agentproc.Proc) *sdsclient.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st, err := c.Stream(context.Background(), sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// nextLeaf waits for a workload certificate whose serial is not in seen.
func nextLeaf(t *testing.T, st *sdsclient.Stream, within time.Duration, seen map[string]bool) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		r, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("no new workload certificate within %v: %v", within, err)
		}
		chain, _, ok := r.Cert(secretmanager.WorkloadCertName)
		if !ok {
			continue
		}
		certs, err := pki.ParseCertificates(chain)
		if err != nil {
			t.Fatal(err)
		}
		if serial := certs[0].SerialNumber.String(); !seen[serial] {
			seen[serial] = true
			return certs[0]
		}
	}
}

// reviewedTokens are the distinct tokens the CA reviewed successfully, in
// the order first seen.
func reviewedTokens(ca *istioca.Server) []istioca.Review {
	var out []istioca.Review
	seen := map[string]bool{}
	for _, r := range ca.Reviews() {
		if r.Authenticated && !seen[r.Token] {
			seen[r.Token] = true
			out = append(out, r)
		}
	}
	return out
}

func checkReview(t *testing.T, s *setup, r istioca.Review) {
	t.Helper()
	if r.ServiceAccount != (istioca.ServiceAccount{Namespace: s.ns, Name: saName}) {
		t.Errorf("token of %+v", r.ServiceAccount)
	}
	if r.PodName != podName || r.PodUID != string(s.pod.UID) || r.NodeName != "node-a" {
		t.Errorf("token bound to pod %q uid %q node %q, want %s %s node-a", r.PodName, r.PodUID, r.NodeName, podName, s.pod.UID)
	}
	if len(r.Audiences) != 1 || r.Audiences[0] != istioca.DefaultAudience {
		t.Errorf("token audiences %v", r.Audiences)
	}
	if life := r.Expiry.Sub(r.IssuedAt); life != 10*time.Minute {
		t.Errorf("token lifetime %v, want 10m", life)
	}
}

// The agent, with a kubeconfig and no token file, gets a pod-bound token
// for audience istio-ca and a certificate from a CA that reviews it.
func TestPodBoundTokenAndCertificate(t *testing.T) {
	s := newSetup(t)
	p := s.start(t)
	leaf := nextLeaf(t, stream(t, p), 30*time.Second, map[string]bool{})
	if got, err := pki.IdentityOf(leaf); err != nil || got != s.id {
		t.Fatalf("certificate for %v (%v), want %s", got, err, s.id)
	}
	toks := reviewedTokens(s.ca)
	if len(toks) != 1 {
		t.Fatalf("%d distinct tokens reviewed, want 1", len(toks))
	}
	checkReview(t, s, toks[0])
	if _, err := os.Stat(filepath.Join(s.dir, "no-such-token")); err == nil {
		t.Error("a token file appeared")
	}
	if strings.Contains(p.Logs(), toks[0].Token) {
		t.Error("the token is in the logs")
	}
}

// With the refresh ratio lowered (MESHAGENT_TOKEN_REFRESH_RATIO; the API's
// 10-minute floor would otherwise mean an 8-minute wait), the agent replaces
// its token long before it expires and renews its certificate with the new
// one.
func TestTokenRefreshedBeforeExpiry(t *testing.T) {
	s := newSetup(t)
	// Refresh after 0.5 % of 10 minutes (3 s); certificates of 4 s renewed
	// at half life.
	// The test CA reviews tokens with the API server, so no renewal
	// succeeds while it is down: the certificate (60 s, renewed every 6 s)
	// must outlive the restart however long the machine takes for it.
	p := s.start(t, "MESHAGENT_TOKEN_REFRESH_RATIO=0.005", "SECRET_TTL=60s", "SECRET_GRACE_PERIOD_RATIO=0.9")
	st := stream(t, p)
	seen := map[string]bool{}
	nextLeaf(t, st, 30*time.Second, seen)
	testwait.Within(t, 30*time.Second, "a second token", func() bool { return len(reviewedTokens(s.ca)) >= 2 })
	toks := reviewedTokens(s.ca)
	first, second := toks[0], toks[1]
	checkReview(t, s, second)
	if !second.IssuedAt.Before(first.Expiry) {
		t.Errorf("second token issued at %s, after the first expired (%s)", second.IssuedAt, first.Expiry)
	}
	if d := second.IssuedAt.Sub(first.IssuedAt); d > time.Minute {
		t.Errorf("second token %v after the first, want about 3s", d)
	}
	// A certificate issued on the new token reaches SDS.
	n := len(s.ca.Reviews())
	nextLeaf(t, st, 30*time.Second, seen)
	testwait.Within(t, 30*time.Second, "a renewal after the refresh", func() bool { return len(s.ca.Reviews()) > n })
}

// The CA refusing the token (Unauthenticated) makes the agent ask for a new
// one at once, although the current one is far from due.
func TestUnauthenticatedTriggersAFreshToken(t *testing.T) {
	s := newSetup(t)
	p := s.start(t, "SECRET_TTL=4s")
	st := stream(t, p)
	seen := map[string]bool{}
	nextLeaf(t, st, 30*time.Second, seen)
	if n := len(reviewedTokens(s.ca)); n != 1 {
		t.Fatalf("%d tokens before the refusal", n)
	}
	s.ca.FailNext(1, codes.Unauthenticated)
	nextLeaf(t, st, 60*time.Second, seen)
	toks := reviewedTokens(s.ca)
	if len(toks) != 2 {
		t.Fatalf("%d distinct tokens after one refusal, want 2", len(toks))
	}
	checkReview(t, s, toks[1])
	if !strings.Contains(p.Logs(), "token refused by a peer; a new one will be requested") {
		t.Error("no log line for the refused token")
	}
}

// Restarting the API server loses nothing: the agent keeps serving its
// certificate while the server is down, and its next renewals, with new
// tokens from the restarted server, succeed.
func TestAPIServerRestart(t *testing.T) {
	s := newSetup(t)
	// The test CA reviews tokens with the API server, so no renewal
	// succeeds while it is down: the certificate (60 s, renewed every 6 s)
	// must outlive the restart however long the machine takes for it.
	p := s.start(t, "MESHAGENT_TOKEN_REFRESH_RATIO=0.005", "SECRET_TTL=60s", "SECRET_GRACE_PERIOD_RATIO=0.9")
	st := stream(t, p)
	seen := map[string]bool{}
	nextLeaf(t, st, 30*time.Second, seen)
	// SDS answers while the API server is down and restarting.
	c, err := sdsclient.Dial(context.Background(), p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	restarted := make(chan error, 1)
	go func() { restarted <- s.env.Restart(context.Background()) }()
	fetches := 0
	for done := false; !done; {
		select {
		case err := <-restarted:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r, err := c.Fetch(ctx, secretmanager.WorkloadCertName)
			cancel()
			if err != nil {
				t.Fatalf("SDS while the API server restarts: %v", err)
			}
			if _, _, ok := r.Cert(secretmanager.WorkloadCertName); !ok {
				t.Fatal("no workload certificate while the API server restarts")
			}
			fetches++
			time.Sleep(100 * time.Millisecond)
		}
	}
	if fetches == 0 {
		t.Fatal("no SDS fetch happened during the restart")
	}
	select {
	case <-p.Done():
		t.Fatal("the agent exited while the API server restarted")
	default:
	}
	before := len(reviewedTokens(s.ca))
	testwait.Within(t, 60*time.Second, "a new token after the restart", func() bool { return len(reviewedTokens(s.ca)) > before })
	n := len(s.ca.Reviews())
	nextLeaf(t, st, 60*time.Second, seen)
	testwait.Within(t, 30*time.Second, "a renewal after the restart", func() bool { return len(s.ca.Reviews()) > n })
}

// A deleted service account: the CA refuses the agent's token, the refresh
// fails with a clear log line, and SDS keeps serving the current
// certificate.
func TestDeletedServiceAccount(t *testing.T) {
	s := newSetup(t)
	// 60 s certificates renewed when 90 % of their life is left: every 6 s.
	p := s.start(t, "SECRET_TTL=60s", "SECRET_GRACE_PERIOD_RATIO=0.9")
	st := stream(t, p)
	seen := map[string]bool{}
	leaf := nextLeaf(t, st, 30*time.Second, seen)
	ctx := context.Background()
	if err := s.env.Client().CoreV1().ServiceAccounts(s.ns).Delete(ctx, saName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := "requesting a token for serviceaccount " + s.ns + "/" + saName + ": "
	testwait.Within(t, 60*time.Second, "the failed token request in the logs", func() bool {
		return strings.Contains(p.Logs(), want)
	})
	if !strings.Contains(p.Logs(), `"token request failed; no valid token"`) {
		t.Error("no error line for the failed token request")
	}
	// The API server may accept the deleted account's token for a few
	// seconds from its cache, so one renewal may still have succeeded: the
	// current certificate is the last one pushed.
	for {
		select {
		case r := <-st.Responses():
			if chain, _, ok := r.Cert(secretmanager.WorkloadCertName); ok {
				certs, err := pki.ParseCertificates(chain)
				if err != nil {
					t.Fatal(err)
				}
				leaf = certs[0]
			}
			continue
		default:
		}
		break
	}
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.Fetch(fctx, secretmanager.WorkloadCertName)
	if err != nil {
		t.Fatalf("SDS after the account was deleted: %v", err)
	}
	chain, _, ok := r.Cert(secretmanager.WorkloadCertName)
	if !ok {
		t.Fatal("no workload certificate served")
	}
	certs, err := pki.ParseCertificates(chain)
	if err != nil {
		t.Fatal(err)
	}
	if certs[0].SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatalf("served serial %x, want the current %x", certs[0].SerialNumber, leaf.SerialNumber)
	}
	if time.Now().After(certs[0].NotAfter) {
		t.Fatal("the served certificate expired during the test")
	}
}

// The xDS proxy sends the control plane the same TokenRequest token as the
// CA gets: one fetcher serves both.
func TestXDSUpstreamGetsTheSameToken(t *testing.T) {
	s := newSetup(t)
	cp := xdsserver.Start(t, xdsserver.Config{CA: s.ca.CA(), ServerNames: []string{istioca.DefaultServerName}})
	p := s.start(t,
		"MESHAGENT_XDS_PROXY=true",
		`PROXY_CONFIG={"discoveryAddress":"`+cp.Addr()+`"}`,
	)
	nextLeaf(t, stream(t, p), 30*time.Second, map[string]bool{})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := filepath.Join(p.Dir, "etc", "istio", "proxy", "XDS")
	testwait.Within(t, 20*time.Second, "the xDS socket", func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(&discovery.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}); err != nil {
		t.Fatal(err)
	}
	if !cp.WaitStreams(20*time.Second, func(c xdsserver.Counts) bool { return c.Opened >= 1 }) {
		t.Fatal("the proxy opened no upstream stream")
	}
	got := cp.Calls()[0].Metadata.Get("authorization")
	toks := reviewedTokens(s.ca)
	if len(got) != 1 || len(toks) != 1 || got[0] != "Bearer "+toks[0].Token {
		t.Fatalf("control plane got authorization %d values; the CA reviewed %d tokens; want the same one token", len(got), len(toks))
	}
}
