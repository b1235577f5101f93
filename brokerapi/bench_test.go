package brokerapi_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/internal/kubeclient"
	"github.com/meshagent/meshagent/test/brokerclient"
)

// BenchmarkOneBroker100Pods: one broker opens SubscribeToX509SVID by pod
// UID for 100 pods of 20 service accounts at once, on a real TLS Unix
// socket, the certificates signed by the in-process CA. Reported: time to
// each pod's first SVID (p50, p90, max), the CSRs made, and the heap the
// 100 open streams hold.
//
//	go test -run '^$' -bench OneBroker100Pods -benchtime 3x ./brokerapi/
func BenchmarkOneBroker100Pods(b *testing.B) {
	const pods, accounts = 100, 20
	var p50, p90, maxd time.Duration
	var csrs int64
	var heap float64
	for range b.N {
		b.StopTimer()
		a := startAgent(b, nil)
		uids := make([]string, pods)
		a.pods.mu.Lock()
		for i := range pods {
			uids[i] = fmt.Sprintf("6f1c2b3a-1111-4222-8333-%012d", i)
			a.pods.m[uids[i]] = mkpod("shop", fmt.Sprintf("w-%d", i), uids[i], fmt.Sprintf("sa-%d", i%accounts), kubeclient.PodRunning)
		}
		a.pods.mu.Unlock()
		c := a.client(b, brokerID)
		ctx, cancel := context.WithCancel(context.Background())
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		csrs0 := a.csrs.n.Load()
		firsts := make([]time.Duration, pods)
		streams := make([]brokerpb.API_SubscribeToX509SVIDClient, pods)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for i, uid := range uids {
			wg.Go(func() {
				st, err := c.SVIDs(ctx, brokerclient.PodRef("", "", uid))
				if err == nil {
					_, err = st.Recv()
				}
				if err != nil {
					b.Error(err)
				}
				firsts[i], streams[i] = time.Since(start), st
			})
		}
		wg.Wait()
		b.StopTimer()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
		p50, p90, maxd = firsts[pods/2], firsts[pods*9/10], firsts[pods-1]
		csrs = a.csrs.n.Load() - csrs0
		heap = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / 1024
		cancel()
		_ = c.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(p50.Microseconds())/1000, "ms-first-p50")
	b.ReportMetric(float64(p90.Microseconds())/1000, "ms-first-p90")
	b.ReportMetric(float64(maxd.Microseconds())/1000, "ms-first-max")
	b.ReportMetric(float64(csrs), "CSRs")
	b.ReportMetric(heap, "heap-KiB-100-streams")
}
