// Command firstsvid is the workload of the node benchmark (test/e2e, make
// bench-node): it notes the time its main function starts, fetches its X.509
// SVID over the SPIFFE Workload API (go-spiffe) from SOCKET, trying again
// every RETRY until one is served, prints one JSON line with both times, and
// then idles until it is stopped. The benchmark reads that line from the
// pod's log; the node's clock is the one both sides read.
package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// Line is what the workload prints.
type Line struct {
	// Started is when main began, the first thing the workload does.
	Started time.Time `json:"started"`
	// Served is when the first SVID was in hand; SpiffeID is its ID.
	Served   time.Time `json:"served,omitzero"`
	SpiffeID string    `json:"spiffe_id,omitempty"`
	// Attempts counts the fetches, the successful one included.
	Attempts int    `json:"attempts"`
	Error    string `json:"error,omitempty"`
	// Dialed is when a plain connection to the socket first succeeded,
	// before the first fetch; Again is how long a second fetch took, on a
	// new connection, right after the first: where the first one's time
	// went (the client's own start, or the agent).
	Dialed time.Time     `json:"dialed,omitzero"`
	Again  time.Duration `json:"again_ns,omitempty"`
}

func main() {
	l := Line{Started: time.Now().UTC()}
	socket := os.Getenv("SOCKET")
	if socket == "" {
		socket = "/run/meshagent/socket"
	}
	retry, err := time.ParseDuration(os.Getenv("RETRY"))
	if err != nil || retry <= 0 {
		retry = 10 * time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for deadline.Err() == nil {
		if c, err := net.Dial("unix", socket); err == nil {
			c.Close()
			l.Dialed = time.Now().UTC()
			break
		}
		select {
		case <-deadline.Done():
		case <-time.After(retry):
		}
	}
	for deadline.Err() == nil {
		l.Attempts++
		fetch, cancelFetch := context.WithTimeout(deadline, 10*time.Second)
		svid, err := workloadapi.FetchX509SVID(fetch, workloadapi.WithAddr("unix://"+socket))
		cancelFetch()
		if err == nil {
			l.Served, l.SpiffeID, l.Error = time.Now().UTC(), svid.ID.String(), ""
			fetch, cancelFetch := context.WithTimeout(deadline, 10*time.Second)
			if _, err := workloadapi.FetchX509SVID(fetch, workloadapi.WithAddr("unix://"+socket)); err == nil {
				l.Again = time.Since(l.Served)
			}
			cancelFetch()
			break
		}
		l.Error = err.Error()
		select {
		case <-deadline.Done():
		case <-time.After(retry):
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(l)
	<-ctx.Done()
}
