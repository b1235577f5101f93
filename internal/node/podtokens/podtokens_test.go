package podtokens

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const uid = "5b1c3f7e-2d4a-4c8e-9f01-23456789abcd"

func FuzzFromVolumeContext(f *testing.F) {
	f.Add(`{"identity.l5d.io":{"token":"a.b.c","expirationTimestamp":"2030-01-01T00:00:00Z"}}`)
	f.Add(`{"identity.l5d.io":{"token":""}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, raw string) {
		tok, ok, err := FromVolumeContext(map[string]string{VolumeContextKey: raw}, "identity.l5d.io")
		if ok && (err != nil || tok.Token == "" || strings.ContainsAny(tok.Token, " \n\t") || tok.ExpirationTimestamp.IsZero()) {
			t.Fatalf("accepted %q as %+v (%v)", raw, tok, err)
		}
	})
}

// Read takes a pod's file beneath the directory alone: a link in its place
// (to a file that looks like a token) is not followed, a name that is not a
// pod UID is refused before any file is opened.
func TestReadStaysInTheDirectory(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	tok := Token{Token: "a.b.c", ExpirationTimestamp: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := Write(outside, uid, tok); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, uid), filepath.Join(dir, uid)); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(dir, uid); err == nil {
		t.Errorf("a link was followed: %+v", got)
	}
	for _, bad := range []string{"../x", "", strings.ToUpper(uid), uid + "/x"} {
		if _, err := Read(dir, bad); err == nil || errors.Is(err, ErrNoToken) {
			t.Errorf("Read(%q): %v, want a refusal of the name", bad, err)
		}
	}
	if err := Remove(dir, uid); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir, uid); !errors.Is(err, ErrNoToken) {
		t.Errorf("after Remove: %v, want ErrNoToken", err)
	}
	if got, err := Read(outside, uid); err != nil || got.Token != tok.Token {
		t.Errorf("the link's target after Remove: %+v, %v", got, err)
	}
}
