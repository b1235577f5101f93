package credfetcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshagent/meshagent/internal/pki"
)

func TestRefreshTime(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		expiry time.Time
		ratio  float64
		want   time.Time
	}{
		{"an hour at 80 %", t0.Add(time.Hour), 0.8, t0.Add(48 * time.Minute)},
		{"ten minutes at 80 %", t0.Add(10 * time.Minute), 0.8, t0.Add(8 * time.Minute)},
		{"whole life", t0.Add(time.Hour), 1, t0.Add(time.Hour)},
		{"a tiny ratio keeps a second", t0.Add(10 * time.Minute), 0.001, t0.Add(time.Second)},
		{"expiry before receipt (clock skew)", t0.Add(-time.Minute), 0.8, t0.Add(time.Second)},
		{"expiry at receipt", t0, 0.8, t0.Add(time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RefreshTime(t0, tt.expiry, tt.ratio); !got.Equal(tt.want) {
				t.Errorf("RefreshTime = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		if got := retryDelay(i + 1); got != w {
			t.Errorf("retryDelay(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := retryDelay(1000); got != retryMax {
		t.Errorf("retryDelay(1000) = %s", got)
	}
}

func TestNewTokenRequestChecksConfig(t *testing.T) {
	good := func() TokenRequestConfig {
		return TokenRequestConfig{
			Client: clientsetTokens{fake.NewClientset()}, Namespace: "shop", ServiceAccount: "web",
			PodName: "web-0", Audiences: []string{pki.IstioAudience},
			Lifetime: time.Hour, RefreshRatio: 0.8,
		}
	}
	tests := []struct {
		name   string
		change func(*TokenRequestConfig)
		want   string
	}{
		{"no client", func(c *TokenRequestConfig) { c.Client = nil }, "no Kubernetes client"},
		{"no namespace", func(c *TokenRequestConfig) { c.Namespace = "" }, "namespace and the service account"},
		{"no service account", func(c *TokenRequestConfig) { c.ServiceAccount = "" }, "namespace and the service account"},
		{"no pod", func(c *TokenRequestConfig) { c.PodName = "" }, "pod name"},
		{"no audience", func(c *TokenRequestConfig) { c.Audiences = nil }, "no audience"},
		{"lifetime below the floor", func(c *TokenRequestConfig) { c.Lifetime = 9 * time.Minute }, "below the API server's minimum of 10m0s"},
		{"no lifetime", func(c *TokenRequestConfig) { c.Lifetime = 0 }, "Config.Lifetime 0s is below"},
		{"no ratio", func(c *TokenRequestConfig) { c.RefreshRatio = 0 }, "Config.RefreshRatio 0 is not in"},
		{"ratio above 1", func(c *TokenRequestConfig) { c.RefreshRatio = 1.5 }, "Config.RefreshRatio"},
		{"negative ratio", func(c *TokenRequestConfig) { c.RefreshRatio = -0.5 }, "Config.RefreshRatio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.change(&c)
			_, err := NewTokenRequest(c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := NewTokenRequest(good()); err != nil {
		t.Fatal(err)
	}
}

// clientsetTokens asks a clientset (here client-go's fake one) for tokens.
type clientsetTokens struct{ kubernetes.Interface }

func (c clientsetTokens) CreateToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
}

// apiStub answers TokenRequests of a fake clientset: each answer is a new
// token expiring lifetime after the fake clock's now, or the error set. A
// call waits on gate when it is set. It stands in for the API server where
// a test must hold a request open or make it fail on cue; the behaviour
// against a real server is tested in kube_test.go.
type apiStub struct {
	clock *clocktesting.FakeClock
	calls atomic.Int32

	mu   sync.Mutex
	err  error
	gate chan struct{}
	last *authenticationv1.TokenRequest
}

func (s *apiStub) client() *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "token" {
			return false, nil, nil
		}
		n := s.calls.Add(1)
		s.mu.Lock()
		gate, err := s.gate, s.err
		s.mu.Unlock()
		if gate != nil {
			<-gate
		}
		if err != nil {
			return true, nil, err
		}
		req := ca.GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		s.mu.Lock()
		s.last = req
		s.mu.Unlock()
		req.Status = authenticationv1.TokenRequestStatus{
			Token:               fmt.Sprintf("token-%d", n),
			ExpirationTimestamp: metav1.NewTime(s.clock.Now().Add(time.Duration(*req.Spec.ExpirationSeconds) * time.Second)),
		}
		return true, req, nil
	})
	return cs
}

func (s *apiStub) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func newStubFetcher(t *testing.T, logger *zap.Logger) (*TokenRequest, *apiStub) {
	t.Helper()
	stub := &apiStub{clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC))}
	f, err := NewTokenRequest(TokenRequestConfig{
		Client: clientsetTokens{stub.client()}, Namespace: "shop", ServiceAccount: "web",
		PodName: "web-0", PodUID: "uid-1", Audiences: []string{"istio-ca"},
		Lifetime: time.Hour, Clock: stub.clock, Logger: logger,
		RefreshRatio: 0.8,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f, stub
}

func mustToken(t *testing.T, f Fetcher) string {
	t.Helper()
	tok, err := f.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTokenRequestAsksForAPodBoundToken(t *testing.T) {
	f, stub := newStubFetcher(t, nil)
	mustToken(t, f)
	req := stub.last
	ref := req.Spec.BoundObjectRef
	if ref == nil || ref.Kind != "Pod" || ref.APIVersion != "v1" || ref.Name != "web-0" || ref.UID != "uid-1" {
		t.Errorf("bound object %+v", ref)
	}
	if len(req.Spec.Audiences) != 1 || req.Spec.Audiences[0] != "istio-ca" || *req.Spec.ExpirationSeconds != 3600 {
		t.Errorf("spec %+v", req.Spec)
	}
}

func TestTokenRequestCachesUntilEightyPercent(t *testing.T) {
	f, stub := newStubFetcher(t, nil)
	first := mustToken(t, f)
	stub.clock.Step(48*time.Minute - time.Nanosecond)
	if got := mustToken(t, f); got != first || stub.calls.Load() != 1 {
		t.Fatalf("before 80 %%: token %q after %d requests", got, stub.calls.Load())
	}
	stub.clock.Step(time.Nanosecond)
	second := mustToken(t, f)
	if second == first || stub.calls.Load() != 2 {
		t.Fatalf("at 80 %%: token %q after %d requests", second, stub.calls.Load())
	}
}

func TestTokenRequestInvalidate(t *testing.T) {
	f, stub := newStubFetcher(t, nil)
	first := mustToken(t, f)
	f.Invalidate("an older token")
	if got := mustToken(t, f); got != first {
		t.Fatalf("a refusal of another token replaced the current one")
	}
	f.Invalidate(first)
	second := mustToken(t, f)
	if second == first || stub.calls.Load() != 2 {
		t.Fatalf("after Invalidate: token %q after %d requests", second, stub.calls.Load())
	}
	Refused(f, second)
	if got := mustToken(t, f); got == second {
		t.Fatal("Refused did not reach the fetcher")
	}
	Refused(File{Path: "unused"}, "x") // a fetcher that keeps nothing: no effect, no panic
}

func TestTokenRequestSharesOneRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, stub := newStubFetcher(t, nil)
		gate := make(chan struct{})
		stub.gate = gate
		const n = 16
		var wg sync.WaitGroup
		toks := make(chan string, n)
		for range n {
			wg.Go(func() {
				tok, err := f.Token(context.Background())
				if err != nil {
					t.Error(err)
				}
				toks <- tok
			})
		}
		// Every caller is blocked: one in the request, the others waiting
		// for it.
		synctest.Wait()
		if c := stub.calls.Load(); c != 1 {
			t.Fatalf("%d requests started for %d waiting callers", c, n)
		}
		close(gate)
		wg.Wait()
		close(toks)
		for tok := range toks {
			if tok != "token-1" {
				t.Errorf("a caller got %q", tok)
			}
		}
		if c := stub.calls.Load(); c != 1 {
			t.Errorf("%d requests for %d concurrent callers", c, n)
		}
	})
}

func TestTokenRequestCallerGivesUpAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, stub := newStubFetcher(t, nil)
		gate := make(chan struct{})
		stub.gate = gate
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := f.Token(ctx)
			errc <- err
		}()
		synctest.Wait() // the caller waits for the request it started
		if c := stub.calls.Load(); c != 1 {
			t.Fatalf("%d requests started, want 1", c)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: %v", err)
		}
		// The request goes on for the others.
		go func() { close(gate) }()
		if tok := mustToken(t, f); tok != "token-1" || stub.calls.Load() != 1 {
			t.Fatalf("token %q after %d requests", tok, stub.calls.Load())
		}
	})
}

func TestTokenRequestFailures(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f, stub := newStubFetcher(t, zap.New(core))
	first := mustToken(t, f)
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccounts"}, "web")
	stub.setErr(notFound)

	// Due for refresh, still valid: the refresh fails, the current token
	// is kept, the failure is logged.
	stub.clock.Step(50 * time.Minute)
	if got := mustToken(t, f); got != first {
		t.Fatalf("during a failing refresh got %q, want the current token", got)
	}
	if stub.calls.Load() != 2 {
		t.Fatalf("%d requests", stub.calls.Load())
	}
	warn := logs.FilterMessage("token refresh failed; the current token is used until it expires").All()
	if len(warn) != 1 || !strings.Contains(fmt.Sprint(warn[0].ContextMap()["error"]), `requesting a token for serviceaccount shop/web: serviceaccounts "web" not found`) {
		t.Fatalf("log lines %v", logs.All())
	}

	// Within the backoff no new request is made.
	mustToken(t, f)
	if stub.calls.Load() != 2 {
		t.Fatalf("a request within the backoff: %d", stub.calls.Load())
	}

	// A refused token is not handed out again: the last error is.
	f.Invalidate(first)
	_, err := f.Token(context.Background())
	if !errors.Is(err, notFound) || !strings.Contains(err.Error(), "requesting a token for serviceaccount shop/web: ") {
		t.Fatalf("after the token was refused: %v", err)
	}
	if stub.calls.Load() != 2 {
		t.Fatalf("a request within the backoff: %d", stub.calls.Load())
	}

	// After the backoff: another attempt, failing again, the delay doubles.
	stub.clock.Step(time.Second)
	if _, err := f.Token(context.Background()); !errors.Is(err, notFound) {
		t.Fatal(err)
	}
	if stub.calls.Load() != 3 {
		t.Fatalf("%d requests", stub.calls.Load())
	}
	stub.clock.Step(time.Second)
	if _, err := f.Token(context.Background()); err == nil || stub.calls.Load() != 3 {
		t.Fatalf("second backoff not respected: %v, %d requests", err, stub.calls.Load())
	}

	// The account is back: the next attempt succeeds and resets the backoff.
	stub.setErr(nil)
	stub.clock.Step(time.Second)
	if got := mustToken(t, f); got == first || got == "" {
		t.Fatalf("recovered token %q", got)
	}
	if logs.FilterMessage("token request failed; no valid token").Len() != 1 {
		t.Errorf("log lines %v", logs.All())
	}
}

func TestTokenRequestRejectsAnEmptyAnswer(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	cs := fake.NewClientset()
	cs.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenRequest{}, nil
	})
	f, err := NewTokenRequest(TokenRequestConfig{
		Client: clientsetTokens{cs}, Namespace: "shop", ServiceAccount: "web", PodName: "web-0",
		Audiences: []string{"istio-ca"}, Clock: clk,
		Lifetime: time.Hour, RefreshRatio: 0.8,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Token(context.Background()); err == nil || !strings.Contains(err.Error(), "answered no token") {
		t.Fatalf("empty answer: %v", err)
	}
}
