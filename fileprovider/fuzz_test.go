package fileprovider

import (
	"strings"
	"testing"
)

func FuzzSplitPair(f *testing.F) {
	for _, s := range []string{"a~b", "~", "a~", "~b", "a~b~c", "", "/etc/certs/cert-chain.pem~/etc/certs/key.pem"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, k, err := splitPair(s)
		if err != nil {
			return
		}
		if c == "" || k == "" || c+"~"+k != s || strings.Contains(c, "~") || strings.Contains(k, "~") {
			t.Fatalf("splitPair(%q) = %q, %q", s, c, k)
		}
	})
}
