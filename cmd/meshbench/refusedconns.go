package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
)

// refusedFlood is how many connections one pod opens at once for
// refusedConns: all but the per-caller limit (32) are refused.
const refusedFlood = 2000

// refusedConns has one pod's process open refusedFlood connections at
// once, each sending an HTTP/2 client's preface and SETTINGS and never
// calling, as a flood would; the agent keeps the per-caller limit of them
// and refuses the others at their handshake. It reports the agent's peak
// RSS over its RSS before, per refused connection.
func (s *scaleRun) refusedConns(ctx context.Context, pod corev1.Pod, rep *Reporter, name func(string) string) error {
	pid := s.agent.Pid()
	p, err := startPodClient(s.nb.podclient, s.agent.SDSSocket(), string(pod.UID))
	if err != nil {
		return err
	}
	defer p.release()
	if err := sleepCtx(ctx, s.nb.b.opts.settle); err != nil {
		return err
	}
	rssBefore, err := rssKB(pid)
	if err != nil {
		return err
	}
	if err := resetHWM(pid); err != nil {
		return err
	}
	hello := append([]byte(http2.ClientPreface), 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0)
	// The first connection is made on the go-ahead; each 'g' makes one more.
	if _, err := p.ctl.Write(append([]byte{'g'}, bytes.Repeat([]byte{'g'}, refusedFlood-1)...)); err != nil {
		return fmt.Errorf("asking podclient for connections: %w", err)
	}
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		closed, kept int
		held         []net.Conn
	)
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range refusedFlood {
		nc, err := receiveConn(p.ctl)
		if err != nil {
			return err
		}
		_, _ = nc.Write(hello)
		wg.Go(func() {
			// The agent refuses within milliseconds; those still open
			// after this are kept.
			_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
			var b [512]byte
			for {
				if _, err := nc.Read(b[:]); err != nil {
					mu.Lock()
					defer mu.Unlock()
					if errors.Is(err, os.ErrDeadlineExceeded) {
						kept++
						held = append(held, nc)
					} else {
						closed++
						_ = nc.Close()
					}
					return
				}
			}
		})
	}
	wg.Wait()
	hwm, err := hwmKB(pid)
	if err != nil {
		return err
	}
	if closed == 0 {
		return fmt.Errorf("none of %d connections of one pod was refused", refusedFlood)
	}
	perConn := float64(hwm-rssBefore) / float64(closed)
	rep.Report(Figure{Name: name("refused_conn_peak_rss_kb"), Unit: "KB", Samples: []float64{perConn}})
	s.nb.b.log("node mode: %d connections of one pod at once, %d refused, %d kept: RSS %d kB, peak %d kB",
		refusedFlood, closed, kept, rssBefore, hwm)
	return nil
}
