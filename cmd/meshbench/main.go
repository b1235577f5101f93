package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/test/agentproc"
)

// options are the command's flags.
type options struct {
	agent        string
	agentArgs    []string
	build        bool
	only         map[string]bool
	keep         bool
	logLevel     string
	pprofDir     string
	timeout      time.Duration
	startTimeout time.Duration

	coldRuns      int
	steadyRuns    int
	settle        time.Duration
	cpuWindow     time.Duration
	cpuWindows    int
	conns         int
	perConn       int
	streamTimeout time.Duration
	secretTTL     time.Duration
	rotations     int
	xdsSmallBytes int
	xdsBytes      int
	xdsRuns       int
	xdsTimeout    time.Duration

	nodePods      []int
	nodePodsPerSA int
	nodeNewPods   int
	nodeBudget    int
	nodeSecretTTL time.Duration
	nodeLiveProcs int
	nodeIdleConns int
}

// groups are the measurement groups -only can select.
var groups = []string{"cold", "steady", "xds", "rotation", "workloadapi", "node"}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("meshbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.agent, "agent", "bin/meshagent", "meshagent binary; built from ./cmd/agent when missing")
	agentArgs := fs.String("agent-args", "run", "arguments of the agent, space-separated")
	fs.BoolVar(&o.build, "build", false, "rebuild the agent binary even when it exists")
	only := fs.String("only", strings.Join(groups, ","), "comma-separated measurement groups to run: "+strings.Join(groups, ", "))
	fs.BoolVar(&o.keep, "keep", false, "keep the agents' working directories and logs")
	fs.StringVar(&o.logLevel, "agent-log-level", "", "MESHAGENT_LOG_LEVEL of the agents (with -keep, debug puts each start-up step's time in their logs)")
	fs.StringVar(&o.pprofDir, "pprof-dir", "", "save heap and goroutine profiles of the steady and Workload API agents (idle and with the streams) and a CPU profile of the rotations here, from the agent's /debug/pprof")
	fs.DurationVar(&o.timeout, "timeout", 290*time.Second, "give up on everything after this long")
	fs.DurationVar(&o.startTimeout, "start-timeout", 15*time.Second, "longest wait for an agent's first secret")
	fs.IntVar(&o.coldRuns, "cold-runs", 20, "cold starts per key type")
	fs.IntVar(&o.steadyRuns, "steady-runs", 3, "agents measured for idle RSS and SDS stream RSS")
	fs.DurationVar(&o.settle, "settle", time.Second, "idle wait before reading RSS")
	fs.DurationVar(&o.cpuWindow, "cpu-window", 5*time.Second, "length of one idle CPU window")
	fs.IntVar(&o.cpuWindows, "cpu-windows", 4, "idle CPU windows (on the first steady agent)")
	fs.IntVar(&o.conns, "conns", 10, "SDS connections for the stream figures")
	fs.IntVar(&o.perConn, "streams-per-conn", 100, "SDS streams per connection")
	fs.DurationVar(&o.streamTimeout, "stream-timeout", 30*time.Second, "longest wait for a secret to reach every stream")
	fs.DurationVar(&o.secretTTL, "secret-ttl", 10*time.Second, "SECRET_TTL of the rotation agent")
	fs.IntVar(&o.rotations, "rotations", 4, "rotations measured")
	fs.IntVar(&o.xdsSmallBytes, "xds-small-bytes", 10_000_000, "payload bytes of the ADS response timed against its 1.2x target")
	fs.IntVar(&o.xdsBytes, "xds-bytes", 100_000_000, "payload bytes of the ADS response whose peak RSS is measured against its 1.2x target")
	fs.IntVar(&o.xdsRuns, "xds-runs", 11, "ADS reads each way and size, after one warm-up each way")
	fs.DurationVar(&o.xdsTimeout, "xds-timeout", 60*time.Second, "longest wait for one large ADS response")
	nodePods := fs.String("node-pods", "100,1000", "node mode: comma-separated pod counts, each measured with its own agent (e.g. 100,1000,5000)")
	fs.IntVar(&o.nodePodsPerSA, "node-pods-per-sa", 10, "node mode: pods per service account (100 pods: 10 identities)")
	fs.IntVar(&o.nodeNewPods, "node-new-pods", 100, "node mode: new pods timed to their first certificate, for each of cached and new identities")
	fs.IntVar(&o.nodeBudget, "node-csr-budget", 8, "node mode: MESHAGENT_CA_MAX_CONCURRENT_CSRS of the agent")
	fs.DurationVar(&o.nodeSecretTTL, "node-secret-ttl", 0, "node mode: SECRET_TTL, whose half-life renewal is the rotation measured; 0 means 30s plus 30ms per pod, time for the streams to open first")
	fs.IntVar(&o.nodeIdleConns, "node-idle-conns", 1000, "node mode: idle connections opened from the pods' processes (without an RPC) to measure the agent's memory and files per connection; 0 skips it")
	fs.IntVar(&o.nodeLiveProcs, "node-live-procs", 1000, "node mode: pod processes kept running; past this many, a process ends once its stream has its first certificate (its connection and stream stay open)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.agentArgs = strings.Fields(*agentArgs)
	// Agents run in their own working directories: a relative path would
	// name nothing there.
	if abs, err := filepath.Abs(o.agent); err == nil {
		o.agent = abs
	}
	for _, f := range strings.Split(*nodePods, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return o, fmt.Errorf("-node-pods: %q is not a positive count", f)
		}
		o.nodePods = append(o.nodePods, n)
	}
	o.only = map[string]bool{}
	for _, g := range strings.Split(*only, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		known := false
		for _, k := range groups {
			known = known || k == g
		}
		if !known {
			return o, fmt.Errorf("-only: unknown group %q (known: %s)", g, strings.Join(groups, ", "))
		}
		o.only[g] = true
	}
	switch {
	case o.nodePodsPerSA < 1, o.nodeNewPods < 1, o.nodeBudget < 1, o.nodeLiveProcs < 0:
		return o, errors.New("-node-pods-per-sa, -node-new-pods and -node-csr-budget must be positive")
	case o.coldRuns < 1, o.steadyRuns < 1, o.conns < 1, o.perConn < 1, o.rotations < 1, o.xdsRuns < 1, o.cpuWindows < 0:
		return o, errors.New("run, window and stream counts must be positive")
	case o.secretTTL < 2*time.Second:
		return o, errors.New("-secret-ttl must be at least 2s")
	case o.xdsBytes < 1 || o.xdsBytes > maxADSMessage/2, o.xdsSmallBytes < 1 || o.xdsSmallBytes > maxADSMessage/2:
		return o, fmt.Errorf("-xds-bytes and -xds-small-bytes must be between 1 and %d", maxADSMessage/2)
	}
	return o, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, opts, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run measures every selected figure and prints its line on stdout; progress
// goes to stderr. It returns the exit code: 1 when a figure failed.
func run(ctx context.Context, opts options, stdout, stderr io.Writer) int {
	defer killAll()
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "meshbench: "+format+"\n", args...)
	}
	if err := raiseFileLimit(); err != nil {
		logf("%v", err)
	}
	if err := ensureAgent(ctx, opts, stderr); err != nil {
		logf("%v", err)
		return 1
	}
	fx, err := startFixture()
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer fx.Close()
	base, err := os.MkdirTemp("", "meshbench-")
	if err != nil {
		logf("%v", err)
		return 1
	}
	if opts.keep {
		logf("agent directories and logs in %s", base)
	} else {
		defer os.RemoveAll(base)
	}
	b := &bench{opts: opts, fx: fx, baseDir: base, log: logf}
	rep := &Reporter{out: stdout}
	started := time.Now()

	if opts.only["cold"] {
		for _, kt := range []struct{ name, cpuName, key string }{
			{"cold_start_ms", "cold_start_agent_cpu_ms", "ec-p256"},
			{"cold_start_rsa2048_ms", "", "rsa-2048"},
		} {
			logf("%d cold starts with %s keys", opts.coldRuns, kt.key)
			wall, cpu, err := b.coldStarts(ctx, kt.name, kt.cpuName, kt.key)
			if err != nil {
				rep.Fail(kt.name, err)
				continue
			}
			rep.Report(wall)
			if kt.cpuName != "" {
				rep.Report(cpu)
			}
		}
	}

	if opts.only["steady"] {
		idle := Figure{Name: "idle_rss_mb", Unit: "MB"}
		anon := Figure{Name: "idle_rss_anon_mb", Unit: "MB"}
		perStream := Figure{Name: "sds_streams_rss_kb_per_stream", Unit: "KB"}
		cpu := Figure{Name: "cpu_idle_ms_per_min", Unit: "ms"}
		var serr error
		for i := range opts.steadyRuns {
			windows := 0
			if i == 0 {
				windows = opts.cpuWindows
			}
			logf("steady agent %d of %d: idle RSS, %d s idle CPU, %d SDS streams", i+1, opts.steadyRuns, int(opts.cpuWindow.Seconds())*windows, opts.conns*opts.perConn)
			res, a, err := b.steady(ctx, windows)
			if err != nil {
				serr = fmt.Errorf("steady agent %d: %w", i+1, err)
				break
			}
			a.Stop(2 * time.Second)
			idle.Samples = append(idle.Samples, res.idleRSSMB)
			anon.Samples = append(anon.Samples, res.idleAnonMB)
			perStream.Samples = append(perStream.Samples, res.perStreamKB)
			cpu.Samples = append(cpu.Samples, res.cpuMsPerMinute...)
		}
		for _, f := range []Figure{idle, anon, perStream, cpu} {
			if f.Name == cpu.Name && opts.cpuWindows == 0 {
				continue
			}
			if serr != nil && len(f.Samples) == 0 {
				rep.Fail(f.Name, serr)
				continue
			}
			rep.Report(f)
		}
		if serr != nil && len(idle.Samples) > 0 {
			logf("%v", serr)
		}
	}

	if opts.only["xds"] {
		runXDS(ctx, b, opts, rep)
	}

	if opts.only["workloadapi"] {
		perStream := Figure{Name: "workloadapi_streams_rss_kb_per_stream", Unit: "KB"}
		var werr error
		for i := range opts.steadyRuns {
			logf("Workload API agent %d of %d: %d FetchX509SVID streams", i+1, opts.steadyRuns, opts.conns*opts.perConn)
			kb, err := b.workloadStreams(ctx)
			if err != nil {
				werr = fmt.Errorf("Workload API agent %d: %w", i+1, err)
				break
			}
			perStream.Samples = append(perStream.Samples, kb)
		}
		if len(perStream.Samples) == 0 {
			rep.Fail(perStream.Name, werr)
		} else {
			rep.Report(perStream)
			if werr != nil {
				logf("%v", werr)
			}
		}
	}

	if opts.only["rotation"] {
		logf("rotation with SECRET_TTL=%v and %d SDS streams, %d rotations", opts.secretTTL, opts.conns*opts.perConn, opts.rotations)
		rot, err := b.rotation(ctx)
		if err != nil {
			rep.Fail("rotation_fanout_ms", err)
		} else {
			rep.Report(Figure{Name: "rotation_fanout_ms", Unit: "ms", Samples: rot.fromCA})
			rep.Report(Figure{Name: "rotation_first_to_last_stream_ms", Unit: "ms", Samples: rot.spread})
			rep.Report(Figure{Name: "rotation_agent_cpu_ms", Unit: "ms", Samples: rot.cpu})
		}
	}

	if opts.only["node"] {
		runNode(ctx, b, opts, rep)
	}

	logf("done in %v", time.Since(started).Round(time.Second))
	if failed := rep.Failed(); len(failed) > 0 {
		logf("failed: %s", strings.Join(failed, ", "))
		return 1
	}
	return 0
}

// runXDS measures the xDS proxy figures for the small and the large
// response on one agent: the time through the proxy over the direct time,
// the CPU time of a proxied read over that of a direct one and the proxy's
// own, and the proxy's peak RSS over its idle RSS, in MB and over the
// response size. The targets: at most 1.2x the direct time for the small
// response, at most 1.2x the response size over idle for the large one.
func runXDS(ctx context.Context, b *bench, opts options, rep *Reporter) {
	sizes := []struct {
		bytes                  int
		ratioTarget, rssTarget string
	}{
		{opts.xdsSmallBytes, "<= 1.2", ""},
		{opts.xdsBytes, "", "<= 1.2"},
	}
	names := func(bytes int) []string {
		p := fmt.Sprintf("xds_forward_%dmb_", bytes/1_000_000)
		return []string{p + "ratio", p + "cpu_ratio", p + "proxy_cpu_ms", p + "peak_rss_over_idle_mb", p + "peak_rss_over_idle_x"}
	}
	a, idle, release, err := b.xdsAgent(ctx)
	if err != nil {
		for _, s := range sizes {
			for _, n := range names(s.bytes) {
				rep.Fail(n, err)
			}
		}
		return
	}
	defer a.Stop(2 * time.Second)
	defer release()
	for _, s := range sizes {
		n := names(s.bytes)
		b.log("%d MB ADS response, %d reads each way", s.bytes/1_000_000, opts.xdsRuns+1)
		res, err := b.xdsForward(ctx, a, s.bytes, idle)
		if err != nil {
			for _, name := range n {
				rep.Fail(name, err)
			}
			continue
		}
		b.log("xDS %d MB: direct read median %.1f ms, through the proxy %.1f ms (%d bytes)",
			s.bytes/1_000_000, Summarize(res.directMs).Median, Summarize(res.proxyMs).Median, res.size)
		rep.Report(Figure{Name: n[0], Unit: "x", Samples: res.ratio, Target: s.ratioTarget})
		rep.Report(Figure{Name: n[1], Unit: "x", Samples: res.cpuRatio})
		rep.Report(Figure{Name: n[2], Unit: "ms", Samples: res.proxyCPUMs})
		rep.Report(Figure{Name: n[3], Unit: "MB", Samples: res.peakOverIdleMB})
		rep.Report(Figure{Name: n[4], Unit: "x", Samples: res.peakOverSize, Target: s.rssTarget})
	}
}

// ensureAgent builds the agent binary when it is missing or -build is set.
func ensureAgent(ctx context.Context, opts options, stderr io.Writer) error {
	if _, err := os.Stat(opts.agent); err == nil && !opts.build {
		return nil
	}
	fmt.Fprintf(stderr, "meshbench: building %s\n", opts.agent)
	cmd := agentproc.BuildCommand(ctx, opts.agent)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s: %w", opts.agent, err)
	}
	return nil
}

// raiseFileLimit lifts the soft limit on open files to the hard limit; the
// agents inherit it.
func raiseFileLimit() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("reading the open-file limit: %w", err)
	}
	if l.Cur >= l.Max {
		return nil
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("raising the open-file limit: %w", err)
	}
	return nil
}
