package credfetcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/meshagent/meshagent/internal/backoff"
	"github.com/meshagent/meshagent/internal/logkeys"
)

// Limits and defaults of TokenRequestConfig.
const (
	// MinTokenLifetime is the shortest lifetime the API server grants.
	MinTokenLifetime = 10 * time.Minute
	// DefaultRequestTimeout bounds one TokenRequest call.
	DefaultRequestTimeout = 30 * time.Second

	// minRefreshDelay keeps a token at least this long whatever the ratio and
	// the clocks say, so no setting turns the fetcher into a request loop.
	minRefreshDelay = time.Second
	// After a failed request the next one waits retryBase, doubling up to
	// retryMax; callers meanwhile get the current token or the last error.
	retryBase = time.Second
	retryMax  = time.Minute
)

// TokenCreator asks the API server for a token of a service account
// (kubeclient.Client). An error the API server answers is an
// *errors.StatusError of k8s.io/apimachinery/pkg/api/errors.
type TokenCreator interface {
	CreateToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// TokenRequestConfig describes a TokenRequest fetcher.
type TokenRequestConfig struct {
	// Client asks the API server for tokens. Required.
	Client TokenCreator
	// Namespace and ServiceAccount name the account the tokens stand for.
	// Required.
	Namespace, ServiceAccount string
	// PodName binds every token to this pod (in Namespace): the token stops
	// being valid when the pod is deleted. Required.
	PodName string
	// PodUID, when set, must be the pod's UID; the API server refuses tokens
	// for a pod of the same name but another UID (a recreated pod).
	PodUID types.UID
	// Audiences of the tokens. Required.
	Audiences []string
	// Lifetime asked for; less than MinTokenLifetime is refused. Required.
	Lifetime time.Duration
	// RefreshRatio is the share of a token's life after which Token asks
	// for a new one, in (0, 1]. Required.
	RefreshRatio float64
	// RequestTimeout bounds one request. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Clock decides when a token is due for refresh. Default the real clock.
	Clock clock.PassiveClock
	// Logger receives a line per token obtained and per failure. Nil: none.
	Logger *zap.Logger
}

// TokenRequest gets tokens of a service account from the Kubernetes API
// (TokenRequest, POST .../serviceaccounts/<sa>/token), bound to the workload's
// pod. Tokens are kept in memory only. A token is reused until RefreshRatio
// of its life has passed (judged from the expiration time the API server
// returns) or until a peer refuses it (Invalidate). Concurrent callers share
// one request in flight. When a refresh fails, the current token is returned
// for as long as it is valid and not refused, and requests are spaced out by
// a capped backoff.
//
// Every method is safe for concurrent use. Each request runs in a goroutine
// of its own that ends when the request does (at most RequestTimeout), so a
// caller that gives up does not cancel it for the others.
type TokenRequest struct {
	cfg   TokenRequestConfig
	clock clock.PassiveClock
	log   *zap.Logger
	name  string // namespace/serviceaccount, for messages

	mu        sync.Mutex
	tok       string    // current token; empty after Invalidate
	expiry    time.Time // expiry of tok
	refreshAt time.Time // when tok is due for replacement
	// requesting is set while a request runs in flight, whose callers
	// share it.
	requesting bool
	flight     singleflight.Group
	failures   int       // failed requests since the last success
	retryAt    time.Time // no request before this after a failure
	lastErr    error     // the last failure, returned while waiting to retry
}

var (
	_ Fetcher     = (*TokenRequest)(nil)
	_ Invalidator = (*TokenRequest)(nil)
)

// NewTokenRequest checks cfg and returns a fetcher. It makes no request: the
// first Token does.
func NewTokenRequest(cfg TokenRequestConfig) (*TokenRequest, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("token request: no Kubernetes client")
	case cfg.Namespace == "" || cfg.ServiceAccount == "":
		return nil, errors.New("token request: the namespace and the service account must be set")
	case cfg.PodName == "":
		return nil, errors.New("token request: the pod name must be set: tokens are bound to the pod")
	case len(cfg.Audiences) == 0:
		return nil, errors.New("token request: no audience")
	}
	if cfg.Lifetime < MinTokenLifetime {
		return nil, fmt.Errorf("token request: Config.Lifetime %s is below the API server's minimum of %s", cfg.Lifetime, MinTokenLifetime)
	}
	if !(cfg.RefreshRatio > 0 && cfg.RefreshRatio <= 1) {
		return nil, fmt.Errorf("token request: Config.RefreshRatio %g is not in (0, 1]", cfg.RefreshRatio)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	name := cfg.Namespace + "/" + cfg.ServiceAccount
	cfg.Audiences = append([]string(nil), cfg.Audiences...)
	return &TokenRequest{
		cfg:   cfg,
		clock: cfg.Clock,
		name:  name,
		log: cfg.Logger.Named("credfetcher").With(
			zap.String(logkeys.ServiceAccount, name), zap.String(logkeys.Pod, cfg.PodName)),
	}, nil
}

// Token returns the current token, asking the API server for a new one when
// there is none or it is due for refresh.
func (t *TokenRequest) Token(ctx context.Context) (string, error) {
	t.mu.Lock()
	now := t.clock.Now()
	if t.tok != "" && now.Before(t.refreshAt) {
		tok := t.tok
		t.mu.Unlock()
		return tok, nil
	}
	if !t.requesting {
		if now.Before(t.retryAt) {
			tok, err := t.fallbackLocked(now)
			t.mu.Unlock()
			return tok, err
		}
		t.requesting = true
	}
	// Under mu: the request clears requesting under mu before it returns,
	// so a caller that saw it set joins that request.
	done := t.flight.DoChan("", t.request)
	t.mu.Unlock()

	select {
	case r := <-done:
		if r.Err == nil {
			return r.Val.(string), nil
		}
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for a token for serviceaccount %s: %w", t.name, ctx.Err())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fallbackLocked(t.clock.Now())
}

// fallbackLocked is the answer while a refresh is failing: the current
// token while it is valid, else the last error.
func (t *TokenRequest) fallbackLocked(now time.Time) (string, error) {
	if t.tok != "" && now.Before(t.expiry) {
		return t.tok, nil
	}
	return "", t.lastErr
}

// Invalidate drops tok if it is the current token, so the next Token asks
// for a new one. A peer that refused tok calls it; a refusal of an older
// token changes nothing.
func (t *TokenRequest) Invalidate(tok string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tok == "" || tok != t.tok {
		return
	}
	t.tok, t.expiry, t.refreshAt = "", time.Time{}, time.Time{}
	t.log.Info("token refused by a peer; a new one will be requested")
}

// request makes one TokenRequest, records its outcome in t and returns the
// token.
func (t *TokenRequest) request() (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.RequestTimeout)
	defer cancel()
	secs := int64(t.cfg.Lifetime / time.Second)
	req := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         t.cfg.Audiences,
			ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				Kind: "Pod", APIVersion: "v1", Name: t.cfg.PodName, UID: t.cfg.PodUID,
			},
		},
	}
	resp, err := t.cfg.Client.CreateToken(ctx, t.cfg.Namespace, t.cfg.ServiceAccount, req)
	if err == nil {
		err = checkTokenResponse(resp)
	}
	received := t.clock.Now()

	t.mu.Lock()
	defer t.mu.Unlock()
	t.requesting = false
	t.flight.Forget("") // the next request is a new one, even before this returns
	if err != nil {
		if apierrors.IsUnauthorized(err) {
			err = fmt.Errorf("the API server refused the agent's own credentials (deleted service account or expired token?): %w", err)
		}
		err = fmt.Errorf("requesting a token for serviceaccount %s: %w", t.name, err)
		t.lastErr = err
		t.failures++
		wait := retryDelay(t.failures)
		t.retryAt = received.Add(wait)
		fields := []zap.Field{zap.Int(logkeys.Failures, t.failures), zap.Duration(logkeys.RetryIn, wait), zap.Error(err)}
		if t.tok != "" && received.Before(t.expiry) {
			t.log.Warn("token refresh failed; the current token is used until it expires",
				append(fields, zap.Time(logkeys.Expiry, t.expiry))...)
		} else {
			t.log.Error("token request failed; no valid token", fields...)
		}
		return "", err
	}
	expiry := resp.Status.ExpirationTimestamp.Time
	t.tok, t.expiry = resp.Status.Token, expiry
	t.refreshAt = RefreshTime(received, expiry, t.cfg.RefreshRatio)
	t.failures, t.retryAt, t.lastErr = 0, time.Time{}, nil
	t.log.Info("token obtained", zap.Time(logkeys.Expiry, expiry), zap.Time(logkeys.RefreshAt, t.refreshAt),
		zap.Strings(logkeys.Audiences, t.cfg.Audiences))
	return t.tok, nil
}

func checkTokenResponse(resp *authenticationv1.TokenRequest) error {
	switch {
	case resp == nil || resp.Status.Token == "":
		return errors.New("the API server answered no token")
	case resp.Status.ExpirationTimestamp.IsZero():
		return errors.New("the API server answered a token without an expiration time")
	}
	return nil
}

// RefreshTime is when a token received at received and expiring at expiry
// is due for replacement: after ratio of its life, and never sooner than a
// second after it arrived (an expiry at or before received, a clock skew,
// does not make every call a new request).
func RefreshTime(received, expiry time.Time, ratio float64) time.Time {
	life := expiry.Sub(received)
	d := time.Duration(float64(life) * ratio)
	if d < minRefreshDelay {
		d = minRefreshDelay
	}
	return received.Add(d)
}

// retryDelay is the wait after the n-th consecutive failure (n >= 1): the
// agent's one backoff rule, at the top of its range (no jitter: an agent
// has one fetcher per account, and its callers wait for nothing new).
func retryDelay(n int) time.Duration {
	return backoff.Policy{Base: retryBase, Cap: retryMax}.Delay(n-1, 1)
}
