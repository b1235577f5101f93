package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/internal/pki"
)

// issue returns a PEM chain and key for a fresh key, valid from nb to na.
func issue(t *testing.T, ca *localca.CA, nb, na time.Time) (chain, key []byte) {
	t.Helper()
	return issueFor(t, ca, pki.SPIFFEIdentity("cluster.local", "soak", "meshsoak"), nb, na)
}

func issueFor(t *testing.T, ca *localca.CA, id pki.Identity, nb, na time.Time) (chain, key []byte) {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.Issue(localca.Leaf{PublicKey: k.Public(), Identity: id, NotBefore: nb, NotAfter: na})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.EncodeKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCertificates(certs), kp
}

func TestCheckHeld(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	chain, key := issue(t, ca, now.Add(-time.Minute), now.Add(30*time.Second))
	otherChain, otherKey := issue(t, ca, now.Add(-time.Minute), now.Add(30*time.Second))
	expChain, expKey := issue(t, ca, now.Add(-time.Hour), now.Add(-time.Second))
	otherIDChain, otherIDKey := issueFor(t, ca, pki.SPIFFEIdentity("cluster.local", "soak", "intruder"), now.Add(-time.Minute), now.Add(30*time.Second))
	want := pki.SPIFFEIdentity("cluster.local", "soak", "meshsoak")

	cases := []struct {
		name string
		h    held
		at   time.Time
		want string // substring of the error; "" for none
	}{
		{"valid", held{chain, key}, now, ""},
		{"other key", held{chain, otherKey}, now, "does not match"},
		{"other chain", held{otherChain, key}, now, "does not match"},
		{"expired", held{expChain, expKey}, now, "expired"},
		{"expires while held", held{chain, key}, now.Add(31 * time.Second), "expired"},
		{"not yet valid", held{chain, key}, now.Add(-2 * time.Minute), "not valid before"},
		{"nothing", held{}, now, "no certificate"},
		{"other identity", held{otherIDChain, otherIDKey}, now, "want"},
		{"garbage chain", held{[]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), key}, now, "chain"},
		{"garbage key", held{chain, []byte("nope")}, now, "key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := checkHeld(c.h, want, c.at)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("checkHeld: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("checkHeld: %v, want error containing %q", err, c.want)
			}
		})
	}
}

func TestLedger(t *testing.T) {
	l := newLedger()
	if l.Total() != 0 || len(l.Lines()) != 0 {
		t.Fatalf("new ledger: total %d lines %v", l.Total(), l.Lines())
	}
	for i := range 5 {
		l.Violate("sds_default", "client %d: expired", i)
	}
	l.Violate("agent_exited", "exit status 2")
	if got := l.Total(); got != 6 {
		t.Fatalf("Total = %d, want 6", got)
	}
	lines := l.Lines()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "agent_exited: 1 ") || !strings.HasPrefix(lines[1], "sds_default: 5 ") {
		t.Fatalf("Lines = %q", lines)
	}
	if strings.Contains(lines[1], "client 3") || !strings.Contains(lines[1], "client 2") {
		t.Fatalf("examples not capped at %d: %q", examplesPerKind, lines[1])
	}
}

func TestTolerances(t *testing.T) {
	if !within(100, 110, 10) || within(100, 111, 10) || !within(100, 50, 0) {
		t.Fatal("within")
	}
	if !rssWithin(20000, 30000, 0.5, 0) || rssWithin(20000, 30001, 0.5, 0) || !rssWithin(20000, 31000, 0.5, 1000) {
		t.Fatal("rssWithin")
	}
}

func TestParseGoroutineTotal(t *testing.T) {
	n, err := parseGoroutineTotal([]byte("goroutine profile: total 42\n1 @ 0x1\n"))
	if err != nil || n != 42 {
		t.Fatalf("got %d, %v", n, err)
	}
	for _, bad := range []string{"", "goroutine profile: total x\n", "heap profile: 1\n", "goroutine profile: total -3"} {
		if _, err := parseGoroutineTotal([]byte(bad)); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}

func TestParseVmRSS(t *testing.T) {
	n, err := parseVmRSS([]byte("Name:\tmeshagent\nVmHWM:\t  9000 kB\nVmRSS:\t  8123 kB\n"))
	if err != nil || n != 8123 {
		t.Fatalf("got %d, %v", n, err)
	}
	for _, bad := range []string{"", "VmRSS: 12 MB\n", "VmRSS: x kB\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}

func FuzzParseGoroutineTotal(f *testing.F) {
	f.Add([]byte("goroutine profile: total 7\n"))
	f.Add([]byte("goroutine profile: total \n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseGoroutineTotal(b)
		if err == nil && n < 0 {
			t.Fatalf("negative total %d", n)
		}
	})
}

func TestParseFlagsCapsDuration(t *testing.T) {
	var sink strings.Builder
	if _, err := parseFlags([]string{"-duration", "6m"}, &sink); err == nil {
		t.Fatal("-duration 6m accepted")
	}
	o, err := parseFlags([]string{"-duration", "2m"}, &sink)
	if err != nil || o.duration != 2*time.Minute || o.seed == 0 {
		t.Fatalf("got %+v, %v", o, err)
	}
}
