package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// held is what one SDS client last read for "default".
type held struct {
	Chain, Key []byte
}

// checkHeld says what is wrong with a held workload certificate at now: no
// certificate, a chain or key that does not parse, a key that does not match
// the leaf, a leaf naming another identity than want, or a leaf outside its
// validity.
func checkHeld(h held, want pki.Identity, now time.Time) error {
	if len(h.Chain) == 0 {
		return errors.New("no certificate")
	}
	certs, err := pki.ParseCertificates(h.Chain)
	if err != nil {
		return fmt.Errorf("chain: %w", err)
	}
	key, err := pki.ParseKeyPEM(h.Key)
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	leaf := certs[0]
	if !pki.PublicKeysEqual(key.Public(), leaf.PublicKey) {
		return errors.New("key does not match leaf")
	}
	if id, err := pki.IdentityOf(leaf); err != nil || id != want {
		return fmt.Errorf("leaf names %+v (%v), want %+v", id, err, want)
	}
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("leaf not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if !now.Before(leaf.NotAfter) {
		return fmt.Errorf("leaf expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// ledger counts invariant violations by kind and keeps the first few
// messages of each kind. It is safe for concurrent use.
type ledger struct {
	mu       sync.Mutex
	counts   map[string]int
	examples map[string][]string
}

const examplesPerKind = 3

func newLedger() *ledger {
	return &ledger{counts: map[string]int{}, examples: map[string][]string{}}
}

// Violate records one violation of kind with its message.
func (l *ledger) Violate(kind, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[kind]++
	if len(l.examples[kind]) < examplesPerKind {
		l.examples[kind] = append(l.examples[kind], fmt.Sprintf(format, args...))
	}
}

// Total is the number of violations of every kind.
func (l *ledger) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.counts {
		n += c
	}
	return n
}

// Lines describes the violations, one kind a line, sorted by kind.
func (l *ledger) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	kinds := make([]string, 0, len(l.counts))
	for k := range l.counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var out []string
	for _, k := range kinds {
		out = append(out, fmt.Sprintf("%s: %d (e.g. %s)", k, l.counts[k], strings.Join(l.examples[k], "; ")))
	}
	return out
}

// within reports whether end is at most tol above base.
func within(base, end, tol int64) bool { return end <= base+tol }

// rssWithin reports whether end RSS is at most base grown by frac plus slack
// kibibytes.
func rssWithin(baseKB, endKB int64, frac float64, slackKB int64) bool {
	return float64(endKB) <= float64(baseKB)*(1+frac)+float64(slackKB)
}

// parseGoroutineTotal takes N from the first line of a debug=1 goroutine
// profile: "goroutine profile: total N".
func parseGoroutineTotal(b []byte) (int, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	const prefix = "goroutine profile: total "
	s, ok := strings.CutPrefix(string(line), prefix)
	if !ok {
		return 0, fmt.Errorf("goroutine profile: unexpected first line %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("goroutine profile: bad total %q", s)
	}
	return n, nil
}

// fdCount is the number of open file descriptors of pid.
func fdCount(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("listing fds of %d: %w", pid, err)
	}
	return len(ents), nil
}

// rssKB is VmRSS of pid in kibibytes.
func rssKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading status of %d: %w", pid, err)
	}
	return parseVmRSS(b)
}

// parseVmRSS finds "VmRSS: <n> kB" in the text of a status file.
func parseVmRSS(status []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "VmRSS" {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS: unexpected value %q", v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("VmRSS: unexpected value %q", v)
		}
		return n, nil
	}
	return 0, errors.New("VmRSS: not in status")
}
