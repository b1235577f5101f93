package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
)

// bench holds what every measurement needs.
type bench struct {
	opts    options
	fx      *fixture
	baseDir string
	runs    int // agent directories made so far
	log     func(format string, args ...any)
}

// newAgent starts an agent in a fresh directory under baseDir.
// With profiling on, the agent gets a known status port for /debug/pprof.
func (b *bench) newAgent(keyType string, ttl time.Duration, profiled bool) (*agentProc, error) {
	b.runs++
	dir := filepath.Join(b.baseDir, fmt.Sprintf("agent-%03d", b.runs))
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating agent directory: %w", err)
	}
	cfg := b.fx.agentConfig(b.opts.agent, b.opts.agentArgs, keyType, ttl)
	cfg.LogLevel = b.opts.logLevel
	if profiled && b.opts.pprofDir != "" {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg.StatusPort = port
	}
	return startAgent(dir, cfg)
}

// agentErr adds the agent's fate and the end of its log to err.
func agentErr(a *agentProc, err error) error {
	select {
	case <-a.Exited():
		err = fmt.Errorf("%w; %v", err, a.ExitErr())
	default:
	}
	if tail := a.LogTail(); tail != "" {
		err = fmt.Errorf("%w\n--- end of %s log ---\n%s", err, a, tail)
	}
	return err
}

// untilExit derives a context that ends when the agent exits.
func untilExit(ctx context.Context, a *agentProc) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-a.Exited():
			cancel(errors.New("agent exited"))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// coldStart starts one agent and measures the time from just before the
// process starts to the first "default" secret on an SDS stream: the client
// polls for the socket every millisecond, then streams. cpu is the agent's
// CPU time (all its threads) when the secret has arrived.
func (b *bench) coldStart(ctx context.Context, keyType string) (wall, cpu time.Duration, err error) {
	a, err := b.newAgent(keyType, 0, false)
	if err != nil {
		return 0, 0, err
	}
	defer a.Stop(2 * time.Second)
	ctx, cancel := context.WithTimeout(ctx, b.opts.startTimeout)
	defer cancel()
	ctx, stop := untilExit(ctx, a)
	defer stop()
	conn, err := dialUnix(a.SDSSocket(), 4<<20)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	at, err := firstSecret(ctx, conn)
	if err != nil {
		return 0, 0, agentErr(a, fmt.Errorf("waiting for the first secret: %w", err))
	}
	cpu, err = schedCPU(a.Pid())
	if err != nil {
		return 0, 0, err
	}
	return at.Sub(a.Started), cpu, nil
}

// coldStarts measures runs cold starts with keyType: the time to the first
// secret in name, and the agent's CPU time by then in cpuName.
func (b *bench) coldStarts(ctx context.Context, name, cpuName, keyType string) (wall, cpu Figure, err error) {
	wall = Figure{Name: name, Unit: "ms"}
	cpu = Figure{Name: cpuName, Unit: "ms"}
	for i := range b.opts.coldRuns {
		w, c, err := b.coldStart(ctx, keyType)
		if err != nil {
			return wall, cpu, fmt.Errorf("run %d: %w", i+1, err)
		}
		wall.Samples = append(wall.Samples, ms(w))
		cpu.Samples = append(cpu.Samples, ms(c))
	}
	return wall, cpu, nil
}

// steadyResult holds the figures measured on one long-running agent.
type steadyResult struct {
	idleRSSMB      float64
	idleAnonMB     float64
	perStreamKB    float64
	cpuMsPerMinute []float64
}

// steady starts an agent with the default TTL, holds one SDS stream, and
// measures its idle RSS after the first certificate, then (when cpuWindows
// is set) its idle CPU, then the RSS growth from 1,000 SDS streams. The
// agent is returned running; the caller stops it.
func (b *bench) steady(ctx context.Context, cpuWindows int) (steadyResult, *agentProc, error) {
	var res steadyResult
	a, err := b.newAgent("ec-p256", 0, true)
	if err != nil {
		return res, nil, err
	}
	fail := func(err error) (steadyResult, *agentProc, error) {
		a.Stop(2 * time.Second)
		return res, nil, agentErr(a, err)
	}
	ctx, stop := untilExit(ctx, a)
	defer stop()

	// One stream, as Envoy holds, for the whole measurement.
	startCtx, cancel := context.WithTimeout(ctx, b.opts.startTimeout)
	defer cancel()
	held, err := openStreams(ctx, a.SDSSocket(), 1, 1)
	if err != nil {
		return fail(err)
	}
	defer held.Close()
	if _, err := held.waitComplete(startCtx, 0); err != nil {
		return fail(fmt.Errorf("waiting for the first secret: %w", err))
	}
	if err := sleepCtx(ctx, b.opts.settle); err != nil {
		return fail(err)
	}
	idle, err := rssKB(a.Pid())
	if err != nil {
		return fail(err)
	}
	res.idleRSSMB = float64(idle) / 1024
	anon, err := procStatusKB(a.Pid(), "RssAnon")
	if err != nil {
		return fail(err)
	}
	res.idleAnonMB = float64(anon) / 1024
	b.log("idle RSS %d kB (%s)", idle, rssBreakdown(a.Pid()))
	b.snapshotProfiles(ctx, a, fmt.Sprintf("agent-%03d-idle", b.runs))

	for i := range cpuWindows {
		d, ticks, err := idleCPU(ctx, a.Pid(), b.opts.cpuWindow)
		if err != nil {
			return fail(err)
		}
		perMin := ms(d) * float64(time.Minute) / float64(b.opts.cpuWindow)
		b.log("idle CPU window %d: %v in %v (%.2f ms/min; utime+stime %v)", i+1, d, b.opts.cpuWindow, perMin, ticks)
		res.cpuMsPerMinute = append(res.cpuMsPerMinute, perMin)
	}

	before, err := rssKB(a.Pid())
	if err != nil {
		return fail(err)
	}
	streamCtx, cancelStreams := context.WithTimeout(ctx, b.opts.streamTimeout)
	defer cancelStreams()
	set, err := openStreams(ctx, a.SDSSocket(), b.opts.conns, b.opts.perConn)
	if err != nil {
		return fail(err)
	}
	defer set.Close()
	if _, err := set.waitComplete(streamCtx, 0); err != nil {
		return fail(fmt.Errorf("waiting for the secret on every stream: %w", err))
	}
	if err := sleepCtx(ctx, b.opts.settle); err != nil {
		return fail(err)
	}
	after, err := rssKB(a.Pid())
	if err != nil {
		return fail(err)
	}
	n := b.opts.conns * b.opts.perConn
	res.perStreamKB = float64(after-before) / float64(n)
	b.log("RSS %d kB before and %d kB with %d streams (%s)", before, after, n, rssBreakdown(a.Pid()))
	b.snapshotProfiles(ctx, a, fmt.Sprintf("agent-%03d-streams", b.runs))
	set.Close()
	return res, a, nil
}

// idleCPU is the CPU time pid uses over window: from per-thread schedstat
// (nanoseconds) where available, else from utime+stime (10 ms ticks), which
// is also returned for comparison.
func idleCPU(ctx context.Context, pid int, window time.Duration) (cpu, ticks time.Duration, err error) {
	s0, serr := schedCPU(pid)
	u0, err := statCPU(pid)
	if err != nil {
		return 0, 0, err
	}
	if err := sleepCtx(ctx, window); err != nil {
		return 0, 0, err
	}
	u1, err := statCPU(pid)
	if err != nil {
		return 0, 0, err
	}
	ticks = max(u1-u0, 0)
	if serr != nil {
		return ticks, ticks, nil
	}
	s1, err := schedCPU(pid)
	if err != nil {
		return ticks, ticks, nil
	}
	return max(s1-s0, 0), ticks, nil
}

// xdsResult holds the samples of one size of the large ADS response
// measurement.
type xdsResult struct {
	directMs, proxyMs, ratio []float64
	// proxyCPUMs is the agent's CPU time during a proxied read. cpuRatio is
	// the CPU time a proxied read costs (this process, which is both the
	// control plane and the client, plus the agent) over the CPU time of
	// the direct read of the same pair: when the direct read keeps every
	// core busy, the time ratio cannot be below it.
	proxyCPUMs, cpuRatio []float64
	// peakOverIdleMB is the agent's peak RSS during a proxied read less its
	// idle RSS; peakOverSize is the same over the response size.
	peakOverIdleMB, peakOverSize []float64
	size                         int
}

// xdsAgent starts an agent for the xDS figures, holds one SDS stream on it
// (as Envoy does) and returns it with its idle RSS in kB once its first
// certificate has settled. The caller stops the agent and closes the stream.
func (b *bench) xdsAgent(ctx context.Context) (*agentProc, int64, func(), error) {
	a, err := b.newAgent("ec-p256", 0, true)
	if err != nil {
		return nil, 0, nil, err
	}
	fail := func(err error) (*agentProc, int64, func(), error) {
		a.Stop(2 * time.Second)
		return nil, 0, nil, agentErr(a, err)
	}
	ctx, stop := untilExit(ctx, a)
	defer stop()
	held, err := openStreams(ctx, a.SDSSocket(), 1, 1)
	if err != nil {
		return fail(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, b.opts.startTimeout)
	defer cancel()
	if _, err := held.waitComplete(startCtx, 0); err != nil {
		held.Close()
		return fail(fmt.Errorf("waiting for the first secret: %w", err))
	}
	if err := sleepCtx(ctx, b.opts.settle); err != nil {
		held.Close()
		return fail(err)
	}
	idle, err := rssKB(a.Pid())
	if err != nil {
		held.Close()
		return fail(err)
	}
	b.log("xDS agent idle RSS %d kB (%s)", idle, rssBreakdown(a.Pid()))
	return a, idle, held.Close, nil
}

// xdsForward reads a response of size payload bytes alternately straight
// from the control plane and through the agent's xDS proxy, each a new ADS
// stream on a warm connection (one TLS connection to the control plane, one
// Unix socket connection to the proxy, whose own upstream connection is
// warm), and records the proxy's peak RSS over idleKB during each proxied
// read (VmHWM, reset before it).
func (b *bench) xdsForward(ctx context.Context, a *agentProc, size int, idleKB int64) (xdsResult, error) {
	var res xdsResult
	ctx, stop := untilExit(ctx, a)
	defer stop()
	if err := b.fx.publishBig(fmt.Sprint(size), size, 1<<20); err != nil {
		return res, err
	}
	dconn, err := b.fx.dialControlPlane()
	if err != nil {
		return res, err
	}
	defer dconn.Close()
	pconn, err := dialUnix(a.XDSSocket(), maxADSMessage)
	if err != nil {
		return res, err
	}
	defer pconn.Close()
	// The CPU time of this process in the last direct and proxied read,
	// and the agent's in the last proxied read.
	var directCPU, proxiedCPU, proxyCPU time.Duration
	direct := func() (time.Duration, error) {
		d, cpu, err := b.fetchBig(ctx, dconn, size, &res)
		directCPU = cpu
		return d, err
	}
	proxied := func() (time.Duration, int64, error) {
		if err := resetHWM(a.Pid()); err != nil {
			b.log("%v; the peak covers the agent's whole life", err)
		}
		cpu0, cerr := schedCPU(a.Pid())
		d, cpu, err := b.fetchBig(ctx, pconn, size, &res)
		if err != nil {
			return 0, 0, agentErr(a, fmt.Errorf("through the proxy: %w", err))
		}
		proxiedCPU = cpu
		if cpu1, err := schedCPU(a.Pid()); err == nil && cerr == nil {
			proxyCPU = cpu1 - cpu0
		}
		hwm, err := hwmKB(a.Pid())
		if err != nil {
			return 0, 0, err
		}
		return d, hwm, nil
	}
	// A first read each way warms both connections (and the proxy's own
	// upstream one) and the control plane, and is not counted.
	if _, err := direct(); err != nil {
		return res, fmt.Errorf("warm-up, direct: %w", err)
	}
	if _, _, err := proxied(); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	for i := range b.opts.xdsRuns {
		dd, err := direct()
		if err != nil {
			return res, fmt.Errorf("run %d, direct: %w", i+1, err)
		}
		pd, hwm, err := proxied()
		if err != nil {
			return res, fmt.Errorf("run %d: %w", i+1, err)
		}
		over := float64(hwm-idleKB) * 1024
		b.log("%d MB response: direct %v (CPU here %v), through the proxy %v (CPU here %v, proxy CPU %v), proxy peak RSS %.1f MB (%.1f MB over idle; %s)",
			size/1_000_000, dd, directCPU, pd, proxiedCPU, proxyCPU, float64(hwm)/1024, over/(1<<20), rssBreakdown(a.Pid()))
		res.directMs = append(res.directMs, ms(dd))
		res.proxyMs = append(res.proxyMs, ms(pd))
		res.ratio = append(res.ratio, float64(pd)/float64(dd))
		res.proxyCPUMs = append(res.proxyCPUMs, ms(proxyCPU))
		if directCPU > 0 && proxiedCPU > 0 {
			res.cpuRatio = append(res.cpuRatio, float64(proxiedCPU+proxyCPU)/float64(directCPU))
		}
		res.peakOverIdleMB = append(res.peakOverIdleMB, over/(1<<20))
		res.peakOverSize = append(res.peakOverSize, over/float64(res.size))
	}
	// With -pprof-dir, profile the agent over more proxied reads after the
	// measured ones, so profiling does not perturb the figures.
	if b.opts.pprofDir != "" {
		label := fmt.Sprintf("xds-%dmb", size/1_000_000)
		const profiled = 3 * time.Second
		wait := b.cpuProfile(ctx, a, label, profiled)
		for end := time.Now().Add(profiled); time.Now().Before(end); {
			if _, _, err := proxied(); err != nil {
				b.log("profiled read: %v", err)
				break
			}
		}
		wait()
		b.snapshotProfiles(ctx, a, label)
	}
	return res, nil
}

// fetchBig reads the large response on conn once, checks its size and
// returns the time the read took and the CPU time this process spent on it
// (0 if schedstat cannot be read).
func (b *bench) fetchBig(ctx context.Context, conn *grpc.ClientConn, want int, res *xdsResult) (time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.xdsTimeout)
	defer cancel()
	if err := waitReady(ctx, conn); err != nil {
		return 0, 0, err
	}
	// This process is both the control plane and the client: every read
	// starts from a collected heap and runs without collections here, so
	// the timings differ only by the path the bytes take.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	cpu0, cerr := schedCPU(os.Getpid())
	size, d, err := fetchADS(ctx, conn, bigRequest())
	if err != nil {
		return 0, 0, err
	}
	var cpu time.Duration
	if cpu1, err := schedCPU(os.Getpid()); err == nil && cerr == nil {
		cpu = cpu1 - cpu0
	}
	if size < want {
		return 0, 0, fmt.Errorf("response of %d bytes, want at least %d", size, want)
	}
	res.size = size
	return d, cpu, nil
}

// rotationResult holds one sample per rotation of each rotation figure.
type rotationResult struct {
	fromCA []float64 // ms from the CA signing to the last stream
	spread []float64 // ms from the first stream to the last
	cpu    []float64 // ms of the agent's CPU time over the rotation
}

// rotation runs an agent with a short SECRET_TTL and 1,000 SDS streams and
// measures, for each rotation, the time from the CA signing the new
// certificate to its arrival on the last stream, from its arrival on the
// first stream to the last, and the CPU time the agent spent from the end
// of the previous rotation to the end of this one (the agent is idle in
// between: this is the renewal, the push to every stream and the ACKs,
// a figure that does not depend on what else runs on the machine).
func (b *bench) rotation(ctx context.Context) (res rotationResult, err error) {
	a, err := b.newAgent("ec-p256", b.opts.secretTTL, true)
	if err != nil {
		return res, err
	}
	defer a.Stop(2 * time.Second)
	ctx, stop := untilExit(ctx, a)
	defer stop()
	set, err := openStreams(ctx, a.SDSSocket(), b.opts.conns, b.opts.perConn)
	if err != nil {
		return res, agentErr(a, err)
	}
	defer set.Close()
	wait := func(i int, d time.Duration) (certArrivals, error) {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return set.waitComplete(ctx, i)
	}
	if _, err := wait(0, b.opts.startTimeout+b.opts.streamTimeout); err != nil {
		return res, agentErr(a, fmt.Errorf("waiting for the first secret on every stream: %w", err))
	}
	// The profile ends between the last two rotations: writing it costs the
	// agent CPU that would otherwise land on a measured rotation.
	waitProfile := b.cpuProfile(ctx, a, "rotation", time.Duration(2*b.opts.rotations-1)*b.opts.secretTTL/4)
	defer waitProfile()
	for i := 1; i <= b.opts.rotations; i++ {
		cpuBefore, err := schedCPU(a.Pid())
		if err != nil {
			return res, err
		}
		c, err := wait(i, 2*b.opts.secretTTL)
		if err != nil {
			return res, agentErr(a, fmt.Errorf("rotation %d: %w", i, err))
		}
		signed, ok := b.fx.issued.latestBefore(c.First)
		if !ok {
			return res, fmt.Errorf("rotation %d: no issuance recorded before its arrival", i)
		}
		b.log("rotation %d: CA signed, first stream +%v, last stream +%v", i, c.First.Sub(signed), c.Last.Sub(signed))
		// The last ACKs may still be on their way: let them land.
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return res, err
		}
		cpuAfter, err := schedCPU(a.Pid())
		if err != nil {
			return res, err
		}
		b.log("rotation %d: agent CPU %v", i, cpuAfter-cpuBefore)
		res.fromCA = append(res.fromCA, ms(c.Last.Sub(signed)))
		res.spread = append(res.spread, ms(c.Last.Sub(c.First)))
		res.cpu = append(res.cpu, ms(cpuAfter-cpuBefore))
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
