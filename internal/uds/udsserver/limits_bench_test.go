package udsserver

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkConnRate is the connection-rate check of one accepted
// connection, over 1,000 callers (the pods of a busy node), each within
// its rate.
func BenchmarkConnRate(b *testing.B) {
	r := newConnRate(1000, 1000)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = podKey(strconv.Itoa(i))
	}
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Millisecond)
		if !r.allow(keys[i%len(keys)], now) {
			b.Fatal("refused within the rate")
		}
	}
}

// BenchmarkConnRateNewCaller is the check of a caller's first connection:
// its bucket is made (and, past rateSweepAt callers, full ones swept).
func BenchmarkConnRateNewCaller(b *testing.B) {
	r := newConnRate(20, 32)
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Millisecond)
		r.allow(podKey(strconv.Itoa(i)), now)
	}
}

// BenchmarkResolveLock is what guarding one connection's resolution costs:
// a connection's record made, its lock taken and given back by an RPC.
func BenchmarkResolveLock(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c := newConn()
		if !c.lockResolve(ctx) {
			b.Fatal("not taken")
		}
		c.unlockResolve()
	}
}
