package credfetcher

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// jwtWith is a JWT-shaped token with payload as its claims (unsigned: the
// agent never checks the signature, the peer does).
func jwtWith(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + ".c2ln"
}

func TestJWTExpiry(t *testing.T) {
	tests := []struct {
		name  string
		token string
		exp   int64
		ok    bool
	}{
		{"exp", jwtWith(`{"exp":1700000000,"sub":"x"}`), 1700000000, true},
		{"float exp", jwtWith(`{"exp":1700000000.5}`), 1700000000, true},
		{"padded payload", "a." + base64.URLEncoding.EncodeToString([]byte(`{"exp":1700000000}`)) + ".c", 1700000000, true},
		{"no exp", jwtWith(`{"sub":"x"}`), 0, false},
		{"string exp", jwtWith(`{"exp":"soon"}`), 0, false},
		{"negative exp", jwtWith(`{"exp":-5}`), 0, false},
		{"huge exp", jwtWith(`{"exp":1e300}`), 0, false},
		{"opaque", "token-vm-app", 0, false},
		{"two parts", "a.b", 0, false},
		{"bad base64", "a.!!!.c", 0, false},
		{"not json", "a." + base64.RawURLEncoding.EncodeToString([]byte("exp")) + ".c", 0, false},
		{"empty", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp, ok := JWTExpiry(tt.token)
			if ok != tt.ok || (ok && exp.Unix() != tt.exp) {
				t.Errorf("JWTExpiry = %v, %v; want %d, %v", exp, ok, tt.exp, tt.ok)
			}
		})
	}
}

func FuzzJWTExpiry(f *testing.F) {
	f.Add(jwtWith(`{"exp":1700000000}`))
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, tok string) {
		if exp, ok := JWTExpiry(tok); ok && exp.Unix() <= 0 {
			t.Errorf("expiry %v accepted", exp)
		}
	})
}

func TestUnexpired(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	path := filepath.Join(t.TempDir(), "token")
	var reported []time.Time
	u := &Unexpired{Fetcher: File{Path: path}, Now: func() time.Time { return now },
		OnExpired: func(exp time.Time) { reported = append(reported, exp) }}
	write := func(tok string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// No file: File's own error, ErrNoToken.
	if _, err := u.Token(context.Background()); !errors.Is(err, ErrNoToken) || errors.Is(err, ErrExpired) {
		t.Errorf("no token file: %v", err)
	}
	valid := jwtWith(`{"exp":1800000600}`) // ten minutes left
	write(valid)
	if tok, err := u.Token(context.Background()); err != nil || tok != valid {
		t.Errorf("valid token: %q, %v", tok, err)
	}
	// Within ExpirySkew of its expiry, and after it: refused, reported once.
	now = time.Unix(1_800_000_600, 0).Add(-ExpirySkew)
	for range 2 {
		if tok, err := u.Token(context.Background()); !errors.Is(err, ErrNoToken) || !errors.Is(err, ErrExpired) || tok != "" {
			t.Errorf("expired token: %q, %v; want ErrNoToken and ErrExpired", tok, err)
		}
	}
	if len(reported) != 1 || reported[0].Unix() != 1_800_000_600 {
		t.Errorf("expiry reported %v, want once", reported)
	}
	// An opaque token has no expiry to know.
	write("token-vm-app")
	if tok, err := u.Token(context.Background()); err != nil || tok != "token-vm-app" {
		t.Errorf("opaque token: %q, %v", tok, err)
	}
}
