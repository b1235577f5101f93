package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/programtb"
	"github.com/meshagent/meshagent/test/sdsclient"
	"github.com/meshagent/meshagent/test/xdsserver"
)

const (
	maxDuration = 5 * time.Minute
	numClients  = 200
	// grace is how long a new client may go without a certificate.
	grace = 10 * time.Second
	// Tolerances of the end-of-soak checks.
	goroutineTol = 10
	fdTol        = 5
	rssFrac      = 0.5
	rssSlackKB   = 24 << 10
	settleFor    = 20 * time.Second
	// RSS after the load may exceed RSS a third of the way into it by this
	// much: the client churn is steady, so more means memory kept per client.
	loadGrowthFrac    = 0.25
	loadGrowthSlackKB = 8 << 10
)

// soakIdentity is the identity the agent's certificates must name.
var soakIdentity = pki.SPIFFEIdentity(soakDomain, soakNS, soakSA)

type options struct {
	agent    string
	duration time.Duration
	seed     uint64
	keep     bool
	agentUID int
	// podsDuration is how long the hostile-pods phase (node mode) runs; 0
	// skips it.
	podsDuration time.Duration
}

// nobody is the user the agent runs as when meshsoak runs as root, so that
// a directory it may not list is really unwatchable for it.
const nobody = 65534

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("meshsoak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.agent, "agent", "bin/meshagent", "meshagent binary to run")
	fs.DurationVar(&o.duration, "duration", 3*time.Minute, "how long to inject faults (at most 5m)")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed; 0 picks one")
	fs.BoolVar(&o.keep, "keep", false, "keep the agent's working directory")
	defUID := -1
	if os.Geteuid() == 0 {
		defUID = nobody
	}
	fs.IntVar(&o.agentUID, "agent-uid", defUID, "uid (and gid) to run the agent as; -1 for this user (default nobody when run as root)")
	fs.DurationVar(&o.podsDuration, "pods-duration", time.Minute, "how long the hostile-pods phase (node mode, API server, pod cgroups) runs; 0 skips it")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.duration <= 0 || o.duration > maxDuration {
		return o, fmt.Errorf("-duration %s: must be positive and at most %s", o.duration, maxDuration)
	}
	if o.podsDuration < 0 || o.podsDuration > maxDuration {
		return o, fmt.Errorf("-pods-duration %s: must be at most %s", o.podsDuration, maxDuration)
	}
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, nil
}

func main() {
	if mode := os.Getenv(podModeEnv); mode != "" {
		os.Exit(runPodClient(mode, os.Getenv(podSocketEnv)))
	}
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshsoak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, opts, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// figures are what a soak prints.
type figures struct {
	checks, clientChecks                  int
	goroutinesBase, goroutinesEnd         int
	fdsBase, fdsEnd                       int
	rssStart, rssLoad, rssLoadEnd, rssEnd int64
	connects, slow, adsStreams            int64
	chaos                                 chaosCounts
	caRequests                            int
	upstream                              xdsserver.Counts
	hostile                               hostileCounts
	budgets                               []budget
	pods                                  podFigures
}

func run(ctx context.Context, opts options, stdout, stderr io.Writer) int {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "meshsoak: "+format+"\n", args...) }
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "meshsoak-")
	if err != nil {
		logf("%v", err)
		return 1
	}
	if opts.keep {
		logf("working directory %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	tb := programtb.New("meshsoak")
	defer tb.Close()
	var ca *istioca.Server
	var xds *xdsserver.Server
	if err := programtb.Guard(func() {
		ca = istioca.Start(tb, istioca.Config{
			TrustDomain: soakDomain,
			Tokens:      map[string]istioca.ServiceAccount{soakToken: {Namespace: soakNS, Name: soakSA}},
		})
		xds = xdsserver.Start(tb, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName}, Tokens: []string{soakToken}})
	}); err != nil {
		logf("starting test servers: %v", err)
		return 1
	}
	a, err := startAgent(agentParams{binary: opts.agent, dir: dir, caAddr: ca.Addr(), xdsAddr: xds.Addr(), serverName: istioca.DefaultServerName, rootPEM: ca.RootPEM(), uid: opts.agentUID})
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer a.stop(5 * time.Second)
	logf("agent pid %d (uid %d), seed %d, duration %s", a.pid(), opts.agentUID, opts.seed, opts.duration)

	led := newLedger()
	var f figures
	if err := warmUp(ctx, a); err != nil {
		logf("agent did not serve a certificate: %v", err)
		logf("agent log: %s", tail(a.path(agentLog)))
		return 1
	}
	if f.goroutinesBase, f.fdsBase, f.rssStart, err = measure(ctx, a); err != nil {
		logf("baseline: %v", err)
		return 1
	}
	logf("baseline: goroutines %d, fds %d, rss %d kB", f.goroutinesBase, f.fdsBase, f.rssStart)

	ch, err := newChaos(tb, ca, xds, a.path(rootFile), logf)
	if err != nil {
		logf("%v", err)
		return 1
	}
	rng := rand.New(rand.NewPCG(opts.seed, 1))
	hc, err := newHostile(filepath.Join(dir, "hostile"), a.path(sdsSocket), opts.agentUID, led)
	if err != nil {
		logf("laying out the hostile clients' files: %v", err)
		return 1
	}
	pool := &clientPool{socket: a.path(sdsSocket), identity: soakIdentity, led: led}
	for range numClients {
		pool.slots = append(pool.slots, &slot{})
	}
	// Ended by a timer, not a deadline: a deadline would travel to the
	// agent as grpc-timeout, and the agent's end of a stream at the deadline
	// could reach a client before its own context ends (a false
	// sds_stream_ended).
	loadCtx, endLoad := context.WithCancel(ctx)
	defer endLoad()
	stopLoad := time.AfterFunc(opts.duration, endLoad)
	defer stopLoad.Stop()
	var wg sync.WaitGroup
	for i := range numClients {
		r := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		wg.Go(func() { pool.run(loadCtx, i, r) })
	}
	var adsOpened int
	wg.Go(func() { adsOpened = runADS(loadCtx, a.path(xdsSocket)) })
	var chaosErr error
	chaosRng := rand.New(rand.NewPCG(rng.Uint64(), 2))
	wg.Go(func() { chaosErr = ch.run(loadCtx, chaosRng) })
	hostileRng := rand.New(rand.NewPCG(rng.Uint64(), 3))
	wg.Go(func() { hc.run(loadCtx, hostileRng) })

	// Continuous checks.
	tick := time.NewTicker(time.Second)
	loadRSSAt := time.Now().Add(opts.duration / 3)
	for loadCtx.Err() == nil {
		select {
		case <-loadCtx.Done():
		case <-tick.C:
		}
		if err := a.exitedErr(); err != nil {
			led.Violate("agent_exited", "%v", err)
			break
		}
		f.checks++
		f.clientChecks += pool.check(time.Now(), grace)
		hc.check(time.Now())
		if f.rssLoad == 0 && time.Now().After(loadRSSAt) {
			f.rssLoad, _ = rssKB(a.pid())
		}
	}
	tick.Stop()
	f.rssLoadEnd, _ = rssKB(a.pid())
	endLoad()
	wg.Wait()
	if chaosErr != nil {
		logf("fault injection failed: %v", chaosErr)
		led.Violate("soak", "fault injection: %v", chaosErr)
	}
	f.chaos, f.connects, f.slow, f.adsStreams, f.caRequests = ch.counts, pool.connects.Load(), pool.slowOnes.Load(), int64(adsOpened), ca.Requests()
	f.upstream = xds.Streams()
	f.hostile = hc.counts()
	f.budgets = caBudget(ca.CSRs(), budgetWindow)
	for _, b := range f.budgets {
		if b.MaxPerWindow > maxCSRsPerIdentityMinute {
			led.Violate("ca_budget", "%s: %d CSRs in the minute from %s (bound %d)", b.Identity, b.MaxPerWindow, b.At.Format(time.TimeOnly), maxCSRsPerIdentityMinute)
		}
	}
	if f.hostile.distinctNames < min(numNames, int(f.hostile.nameStreams)) {
		led.Violate("file_names", "%d distinct names served of %d streams", f.hostile.distinctNames, f.hostile.nameStreams)
	}
	if err := a.exitedErr(); err != nil {
		led.Violate("agent_exited", "%v", err)
	} else {
		settle(ctx, a, &f, logf)
		if !within(int64(f.goroutinesBase), int64(f.goroutinesEnd), goroutineTol) {
			led.Violate("goroutines", "baseline %d, end %d (tolerance %d)", f.goroutinesBase, f.goroutinesEnd, goroutineTol)
		}
		if !within(int64(f.fdsBase), int64(f.fdsEnd), fdTol) {
			led.Violate("fds", "baseline %d, end %d (tolerance %d)", f.fdsBase, f.fdsEnd, fdTol)
		}
		if f.rssLoad > 0 && !rssWithin(f.rssLoad, f.rssLoadEnd, loadGrowthFrac, loadGrowthSlackKB) {
			led.Violate("rss_load", "under load %d kB, at end of load %d kB (tolerance +%.0f%% +%d kB)", f.rssLoad, f.rssLoadEnd, loadGrowthFrac*100, loadGrowthSlackKB)
		}
		if !rssWithin(f.rssStart, f.rssEnd, rssFrac, rssSlackKB) {
			led.Violate("rss", "start %d kB, end %d kB (tolerance +%.0f%% +%d kB)", f.rssStart, f.rssEnd, rssFrac*100, rssSlackKB)
		}
	}
	if opts.podsDuration > 0 {
		f.pods = runPods(ctx, opts.agent, opts.podsDuration, led, logf)
	} else {
		f.pods.skipped = "-pods-duration 0"
	}
	report(stdout, opts, f, led)
	if led.Total() > 0 {
		logf("agent log: %s", tail(a.path(agentLog)))
		return 1
	}
	return 0
}

// warmUp waits until the agent serves a valid "default" to one client.
func warmUp(ctx context.Context, a *agent) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, a.path(sdsSocket))
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.Stream(ctx, sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := st.Next(ctx)
	if err != nil {
		return err
	}
	chain, key, _ := r.Cert(secretmanager.WorkloadCertName)
	if err := checkHeld(held{chain, key}, soakIdentity, time.Now()); err != nil {
		return err
	}
	// Let the closed stream and connection wind down before the baseline.
	sleepCtx(ctx, 2*time.Second)
	return nil
}

func measure(ctx context.Context, a *agent) (goroutines, fds int, rss int64, err error) {
	if goroutines, err = a.goroutines(ctx); err != nil {
		return
	}
	if fds, err = fdCount(a.pid()); err != nil {
		return
	}
	rss, err = rssKB(a.pid())
	return
}

// settle polls the end figures until goroutines and fds are back within
// tolerance or settleFor passes; the last reading stays in f.
func settle(ctx context.Context, a *agent, f *figures, logf func(string, ...any)) {
	deadline := time.Now().Add(settleFor)
	for {
		g, fds, rss, err := measure(ctx, a)
		if err != nil {
			logf("end figures: %v", err)
		} else {
			f.goroutinesEnd, f.fdsEnd, f.rssEnd = g, fds, rss
			if within(int64(f.goroutinesBase), int64(g), goroutineTol) && within(int64(f.fdsBase), int64(fds), fdTol) {
				return
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 500*time.Millisecond) {
			return
		}
	}
}

func report(w io.Writer, opts options, f figures, led *ledger) {
	fmt.Fprintf(w, "SOAK duration %s seed %d clients %d secret_ttl %s\n", opts.duration, opts.seed, numClients, secretTTL)
	fmt.Fprintf(w, "SOAK violations %d (checks %d, client checks %d)\n", led.Total(), f.checks, f.clientChecks)
	for _, l := range led.Lines() {
		fmt.Fprintf(w, "SOAK   %s\n", l)
	}
	fmt.Fprintf(w, "SOAK goroutines baseline %d end %d (tolerance %d)\n", f.goroutinesBase, f.goroutinesEnd, goroutineTol)
	fmt.Fprintf(w, "SOAK fds baseline %d end %d (tolerance %d)\n", f.fdsBase, f.fdsEnd, fdTol)
	fmt.Fprintf(w, "SOAK rss start %d kB, a third into the load %d kB, end of load %d kB, end %d kB (tolerance end/start +%.0f%% +%d kB, load growth +%.0f%% +%d kB)\n",
		f.rssStart, f.rssLoad, f.rssLoadEnd, f.rssEnd, rssFrac*100, rssSlackKB, loadGrowthFrac*100, loadGrowthSlackKB)
	c := f.chaos
	fmt.Fprintf(w, "SOAK faults ca_restarts %d ca_slow %d ca_bad %d xds_flaps %d root_rewrites %d root_extra %d\n",
		c.CARestarts, c.CASlow, c.CABad, c.XDSFlaps, c.RootRewrites, c.RootExtras)
	fmt.Fprintf(w, "SOAK clients connects %d slow_readers %d ads_streams %d upstream_streams %d (rejected %d) ca_requests %d\n",
		f.connects, f.slow, f.adsStreams, f.upstream.Opened, f.upstream.Rejected, f.caRequests)
	hc := f.hostile
	unwatchable := "yes"
	if !hc.unwatchableReal {
		unwatchable = "no (the agent runs as this user and can list the directory)"
	}
	fmt.Fprintf(w, "SOAK hostile unwatchable_dir sessions %d rewrites %d updates %d (really unwatchable: %s)\n",
		hc.unwatchable.sessions, hc.unwatchable.rewrites, hc.unwatchable.updates, unwatchable)
	fmt.Fprintf(w, "SOAK hostile vanishing_dir sessions %d remakes %d updates %d\n",
		hc.vanishing.sessions, hc.vanishing.rewrites, hc.vanishing.updates)
	fmt.Fprintf(w, "SOAK hostile names streams %d served %d distinct %d (of %d)\n",
		hc.nameStreams, hc.namesServed, hc.distinctNames, numNames)
	for _, b := range f.budgets {
		id := b.Identity
		if id == "" {
			id = "(none)"
		}
		fmt.Fprintf(w, "SOAK ca_budget identity %s csrs %d max_per_minute %d (bound %d)\n", id, b.Total, b.MaxPerWindow, maxCSRsPerIdentityMinute)
	}
	reportPods(w, f.pods)
	if led.Total() == 0 {
		fmt.Fprintln(w, "SOAK PASS")
	} else {
		fmt.Fprintln(w, "SOAK FAIL")
	}
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// raiseFileLimit lifts the soft open-file limit to the hard one; 200 clients
// and the agent (which inherits it) need a few hundred descriptors.
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
