package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// workloadStreams measures what one SPIFFE Workload API stream costs the
// agent, as steady does for SDS streams: a fresh agent holding one SDS
// stream, then conns x perConn FetchX509SVID streams each holding its first
// SVID; RSS growth over the stream count.
func (b *bench) workloadStreams(ctx context.Context) (float64, error) {
	a, err := b.newAgent("ec-p256", 0, true)
	if err != nil {
		return 0, err
	}
	defer a.Stop(2 * time.Second)
	ctx, stop := untilExit(ctx, a)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, b.opts.startTimeout)
	defer cancel()
	held, err := openStreams(ctx, a.SDSSocket(), 1, 1)
	if err != nil {
		return 0, agentErr(a, err)
	}
	defer held.Close()
	if _, err := held.waitComplete(startCtx, 0); err != nil {
		return 0, agentErr(a, fmt.Errorf("waiting for the first secret: %w", err))
	}
	if err := sleepCtx(ctx, b.opts.settle); err != nil {
		return 0, agentErr(a, err)
	}
	before, err := rssKB(a.Pid())
	if err != nil {
		return 0, agentErr(a, err)
	}
	b.snapshotProfiles(ctx, a, fmt.Sprintf("agent-%03d-workloadapi-idle", b.runs))

	streamCtx, cancelStreams := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"), b.opts.streamTimeout)
	defer cancelStreams()
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	n := 0
	for range b.opts.conns {
		conn, err := dialUnix(a.SDSSocket(), 4<<20)
		if err != nil {
			return 0, agentErr(a, err)
		}
		conns = append(conns, conn)
		client := workload.NewSpiffeWorkloadAPIClient(conn)
		for range b.opts.perConn {
			stream, err := client.FetchX509SVID(streamCtx, &workload.X509SVIDRequest{})
			if err != nil {
				return 0, agentErr(a, fmt.Errorf("opening Workload API stream %d: %w", n+1, err))
			}
			resp, err := stream.Recv()
			if err != nil {
				return 0, agentErr(a, fmt.Errorf("Workload API stream %d: %w", n+1, err))
			}
			if len(resp.GetSvids()) != 1 {
				return 0, agentErr(a, fmt.Errorf("Workload API stream %d: %d SVIDs, want 1", n+1, len(resp.GetSvids())))
			}
			n++
		}
	}
	if err := sleepCtx(ctx, b.opts.settle); err != nil {
		return 0, agentErr(a, err)
	}
	after, err := rssKB(a.Pid())
	if err != nil {
		return 0, agentErr(a, err)
	}
	b.snapshotProfiles(ctx, a, fmt.Sprintf("agent-%03d-workloadapi-streams", b.runs))
	b.log("RSS %d kB before and %d kB with %d Workload API streams (%s)", before, after, n, rssBreakdown(a.Pid()))
	return float64(after-before) / float64(n), nil
}
