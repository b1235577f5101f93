package outputcerts

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshagent/meshagent/internal/files"
	"github.com/meshagent/meshagent/internal/files/certfile"
	"github.com/meshagent/meshagent/internal/pki"
)

// loadAttempts and loadPause bound how long Load waits for a write in
// progress (a new key renamed in, the chain not yet) to complete.
var (
	loadAttempts = 5
	loadPause    = 10 * time.Millisecond
)

// Load reads back the certificate and key in dir, for serving at once after
// a restart. It fails unless both files are present, parse and match, the
// leaf is valid at now, and it names exactly id. Errors wrap fs.ErrNotExist,
// pki.ErrKeyMismatch, pki.ErrNotValidNow or pki.ErrIdentityMismatch where
// they apply. Checking the chain against the current roots is the caller's
// business (pki.VerifyIssued).
//
// A mismatched pair may be a write in progress, so Load reads again a few
// times, for at most about 100 ms, before reporting it.
func Load(dir string, id pki.Identity, now time.Time) (*certfile.Pair, error) {
	chainPath, keyPath := filepath.Join(dir, files.CertChainFile), filepath.Join(dir, files.KeyFile)
	var (
		p   *certfile.Pair
		err error
	)
	for attempt := range loadAttempts {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * loadPause)
		}
		p, err = certfile.LoadPair(chainPath, keyPath, now)
		if !errors.Is(err, pki.ErrKeyMismatch) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("loading output certificates: %w", err)
	}
	if err := check(p, id, now); err != nil {
		return nil, fmt.Errorf("loading output certificates: %w", err)
	}
	return p, nil
}

// check adds to certfile's checks (parse, match, not expired) the ones a
// restart needs: valid now and for exactly id.
func check(p *certfile.Pair, id pki.Identity, now time.Time) error {
	leaf := p.Leaf()
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("%w: not valid before %s", pki.ErrNotValidNow, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	got, err := pki.IdentityOf(leaf)
	if err != nil {
		return err
	}
	if !got.Matches(id) {
		return fmt.Errorf("%w: found %s, want %s", pki.ErrIdentityMismatch, got, id)
	}
	return nil
}
