package credfetcher

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// ErrExpired is wrapped (beside ErrNoToken) by Unexpired's error for a token
// whose expiry has passed.
var ErrExpired = errors.New("token expired")

// ExpirySkew is how long before its "exp" claim Unexpired gives a token up:
// the peer checks the expiry on its own clock.
const ExpirySkew = time.Minute

// maxJWTLen bounds the token JWTExpiry parses.
const maxJWTLen = 64 << 10

// JWTExpiry returns the "exp" claim of a JWT (three base64url parts, the
// second a JSON object), without checking its signature. ok is false for a
// token that is not such a JWT or has no numeric "exp": an opaque token has no
// expiry the agent can know.
func JWTExpiry(token string) (exp time.Time, ok bool) {
	if len(token) > maxJWTLen {
		return time.Time{}, false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	f, err := claims.Exp.Float64()
	if err != nil || math.IsNaN(f) || f <= 0 || f > math.MaxInt32*4 {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}

// Unexpired hands out Fetcher's token while it is usable: a JWT whose "exp"
// claim is less than ExpirySkew away is refused with an error wrapping
// ErrNoToken and ErrExpired, so that a client that has another credential
// (the VM flow: the certificate in PROV_CERT, see docs/vm.md) sends no token
// rather than one the peer refuses. Other errors and tokens pass through.
type Unexpired struct {
	Fetcher Fetcher
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnExpired, when set, is called with the expiry each time the token
	// first turns out to be expired (once per token, for a log line).
	OnExpired func(exp time.Time)

	reported atomic.Pointer[string]
}

// Token returns the token, or an error when it has expired.
func (u *Unexpired) Token(ctx context.Context) (string, error) {
	tok, err := u.Fetcher.Token(ctx)
	if err != nil {
		return "", err
	}
	exp, ok := JWTExpiry(tok)
	now := time.Now
	if u.Now != nil {
		now = u.Now
	}
	if !ok || now().Add(ExpirySkew).Before(exp) {
		return tok, nil
	}
	if last := u.reported.Load(); (last == nil || *last != tok) && u.OnExpired != nil {
		u.reported.Store(&tok)
		u.OnExpired(exp)
	}
	return "", fmt.Errorf("%w: %w at %s", ErrNoToken, ErrExpired, exp.UTC().Format(time.RFC3339))
}

// Invalidate passes a refusal on to Fetcher.
func (u *Unexpired) Invalidate(token string) { Refused(u.Fetcher, token) }
