package xdsproxy

import (
	"context"
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/controlplane"
)

// BenchmarkForward fetches one CDS response of the given size, either
// straight from the control plane (TLS, token, as the proxy dials it) or
// through the proxy's socket, with the same client decoding it as Envoy
// would. Each op is a new stream on a warm connection, as is the proxy's
// upstream stream on its shared connection. Besides time and MB/s it reports:
//
//	x-direct          proxied time per op over direct time per op
//	peak-heap-MB      the highest live heap seen during the run (client,
//	                  proxy and control plane share the process)
//	extra-B/op        bytes allocated per op beyond the direct path: what the
//	                  proxy itself costs
//
// Run: go test -run '^$' -bench BenchmarkForward -benchtime 5x ./xdsproxy/
func BenchmarkForward(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"10MB", 10 << 20}, {"100MB", 100 << 20}} {
		b.Run(size.name, func(b *testing.B) {
			r := newRig(b, rigOptions{tweak: func(cfg *Config) { cfg.Logger = zap.NewNop() }})
			if err := r.up.SetResources(testNodeID, "big", map[resource.Type][]types.Resource{
				resource.ClusterType: bigClusters(size.bytes, 1<<20),
			}); err != nil {
				b.Fatal(err)
			}
			direct, err := controlplane.Dial(controlplane.Config{
				Addr:        r.up.Addr(),
				ServerName:  testSAN,
				Roots:       controlplane.StaticRoots{Pool: r.ca.Pool()},
				Token:       r.tokens,
				Metadata:    map[string]string{"ClusterID": testClusterID},
				DialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(testMaxMsg))},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer direct.Close()
			proxied := dialSocket(b, r.socket)

			var directNs, directBytes float64
			b.Run("direct", func(b *testing.B) {
				directNs, directBytes = runFetches(b, direct)
			})
			b.Run("proxy", func(b *testing.B) {
				ns, bytes := runFetches(b, proxied)
				if directNs > 0 {
					b.ReportMetric(ns/directNs, "x-direct")
					b.ReportMetric(bytes-directBytes, "extra-B/op")
				}
			})
		})
	}
}

// runFetches times b.N fetches over conn and returns ns and bytes allocated
// per op.
func runFetches(b *testing.B, conn *grpc.ClientConn) (nsPerOp, allocPerOp float64) {
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	fetch := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := client.StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(&discovery.DiscoveryRequest{Node: testNode(), TypeUrl: resource.ClusterType}); err != nil {
			b.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		return proto.Size(resp)
	}
	b.SetBytes(int64(fetch())) // also warms the connection
	runtime.GC()
	b.ReportAllocs()
	peak := watchHeap()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		fetch()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MB")
	nsPerOp = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	allocPerOp = float64(after.TotalAlloc-before.TotalAlloc) / float64(b.N)
	return nsPerOp, allocPerOp
}

// watchHeap samples the live heap until the returned function is called,
// which returns the highest value seen.
func watchHeap() func() uint64 {
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var mu sync.Mutex
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			rtmetrics.Read(sample)
			mu.Lock()
			peak = max(peak, sample[0].Value.Uint64())
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}
