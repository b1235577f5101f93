package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/meshagent/meshagent/internal/localca"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/programtb"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// chaosCounts are the faults injected.
type chaosCounts struct {
	CARestarts, CASlow, CABad, XDSFlaps, RootRewrites, RootExtras int
}

// chaos injects one fault at a time, with a quiet gap between faults, so a
// certificate valid for 30 s is never starved by design.
type chaos struct {
	tb       *programtb.TB
	ca       *istioca.Server
	xds      *xdsserver.Server
	rootPath string
	rootPEM  []byte
	extra    []byte // a root of another CA, appended and later removed
	logf     func(string, ...any)
	counts   chaosCounts
}

func newChaos(tb *programtb.TB, ca *istioca.Server, xds *xdsserver.Server, rootPath string, logf func(string, ...any)) (*chaos, error) {
	other, err := localca.New(localca.Config{})
	if err != nil {
		return nil, fmt.Errorf("creating extra root: %w", err)
	}
	return &chaos{tb: tb, ca: ca, xds: xds, rootPath: rootPath, rootPEM: ca.RootPEM(), extra: other.RootPEM(), logf: logf}, nil
}

// run injects faults until ctx ends, then leaves everything healthy.
func (c *chaos) run(ctx context.Context, rng *rand.Rand) error {
	defer c.heal()
	for {
		if !sleepCtx(ctx, time.Duration(3000+rng.IntN(5000))*time.Millisecond) {
			return nil
		}
		hold := func(lo, hi int) bool { // hold a fault lo..hi ms, false when ctx ended
			return sleepCtx(ctx, time.Duration(lo+rng.IntN(hi-lo))*time.Millisecond)
		}
		var err error
		switch rng.IntN(6) {
		case 0:
			c.counts.CARestarts++
			c.ca.Stop()
			hold(1000, 5000)
			err = c.restartCA()
		case 1:
			c.counts.CASlow++
			c.ca.SetDelay(2 * time.Second)
			hold(4000, 10000)
			c.ca.SetDelay(0)
		case 2:
			c.counts.CABad++
			if rng.IntN(2) == 0 {
				c.ca.SetMode(istioca.ModeWrongSAN)
			} else {
				c.ca.SetMode(istioca.ModeExpired)
			}
			hold(2000, 5000)
			c.ca.SetMode(istioca.ModeOK)
		case 3:
			c.counts.XDSFlaps++
			c.xds.Stop()
			hold(500, 3000)
			err = c.restartXDS()
		case 4:
			c.counts.RootRewrites++
			err = c.writeRoot(c.rootPEM, rng.IntN(2) == 0)
		case 5:
			c.counts.RootExtras++
			if err = c.writeRoot(bytes.Join([][]byte{c.rootPEM, c.extra}, nil), false); err == nil {
				hold(2000, 6000)
				err = c.writeRoot(c.rootPEM, true)
			}
		}
		if err != nil {
			return err
		}
	}
}

// heal puts the CA, the control plane and the root file back as they were.
func (c *chaos) heal() {
	c.ca.SetDelay(0)
	c.ca.SetMode(istioca.ModeOK)
	if err := c.restartCA(); err != nil {
		c.logf("%v", err)
	}
	if err := c.restartXDS(); err != nil {
		c.logf("%v", err)
	}
	if err := c.writeRoot(c.rootPEM, true); err != nil {
		c.logf("%v", err)
	}
}

func (c *chaos) restartCA() error {
	if err := programtb.Guard(func() { c.ca.Restart(c.tb) }); err != nil {
		return fmt.Errorf("restarting CA: %w", err)
	}
	return nil
}

func (c *chaos) restartXDS() error {
	if err := programtb.Guard(func() { c.xds.Restart(c.tb) }); err != nil {
		return fmt.Errorf("restarting control plane: %w", err)
	}
	return nil
}

// writeRoot replaces the root file's content, in place or by renaming a new
// file over it (as a Kubernetes volume update does).
func (c *chaos) writeRoot(data []byte, rename bool) error {
	if !rename {
		if err := os.WriteFile(c.rootPath, data, 0o644); err != nil {
			return fmt.Errorf("rewriting root file: %w", err)
		}
		return nil
	}
	tmp := c.rootPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("rewriting root file: %w", err)
	}
	if err := os.Rename(tmp, c.rootPath); err != nil {
		return fmt.Errorf("rewriting root file: %w", err)
	}
	return nil
}
