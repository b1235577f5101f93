package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/programtb"
)

// Node mode's names in the API server: the agent's own service account (a
// trusted node account of the CA) and its namespace.
const (
	nodeAgentNamespace = "meshagent-system"
	nodeAgentAccount   = "meshagent"
)

// nodeBench is what the node-mode figures share: the API server and the
// podclient program.
type nodeBench struct {
	b         *bench
	kube      *kubeenv.Env
	podclient string
	kubeconf  string
}

// runNode measures the node-mode figures at each pod count of -node-pods.
func runNode(ctx context.Context, b *bench, opts options, rep *Reporter) {
	names := []string{"node_rss_mb"}
	failAll := func(err error) {
		for _, n := range names {
			rep.Fail(n, err)
		}
	}
	nb := &nodeBench{b: b, podclient: filepath.Join(b.baseDir, "podclient")}
	b.log("node mode: building the podclient program, starting the API server")
	build := exec.CommandContext(ctx, "go", "build", "-o", nb.podclient, "./cmd/meshbench/podclient")
	if out, err := build.CombinedOutput(); err != nil {
		failAll(fmt.Errorf("building podclient (run from the module root): %v: %s", err, out))
		return
	}
	kube, err := kubeenv.Start(ctx, kubeenv.Options{})
	if err != nil {
		failAll(err)
		return
	}
	defer kube.Stop()
	nb.kube = kube
	nb.kubeconf = filepath.Join(b.baseDir, "kubeconfig")
	// The agent lists and watches pods as the cluster's admin: RBAC is not
	// what is measured here.
	if err := kube.Kubeconfig(nb.kubeconf, kube.AdminToken()); err != nil {
		failAll(err)
		return
	}
	if _, err := kube.CreateNamespace(ctx, nodeAgentNamespace); err != nil {
		failAll(err)
		return
	}
	if _, err := kube.CreateServiceAccount(ctx, nodeAgentNamespace, nodeAgentAccount); err != nil {
		failAll(err)
		return
	}
	var rss []struct {
		pods, ids int
		mb        float64
	}
	for _, n := range opts.nodePods {
		ids := max(1, n/opts.nodePodsPerSA)
		b.log("node mode: %d pods of %d service accounts", n, ids)
		mb, err := nb.scale(ctx, n, ids, rep)
		if err != nil {
			rep.Fail(fmt.Sprintf("node_%d_pods", n), err)
			continue
		}
		rss = append(rss, struct {
			pods, ids int
			mb        float64
		}{n, ids, mb})
	}
	for i := 1; i < len(rss); i++ {
		a, c := rss[i-1], rss[i]
		dp, di := float64(c.pods-a.pods), float64(c.ids-a.ids)
		rep.Report(Figure{Name: fmt.Sprintf("node_rss_kb_per_pod_%d_to_%d", a.pods, c.pods), Unit: "KB", Samples: []float64{(c.mb - a.mb) * 1024 / dp}})
		if di > 0 {
			rep.Report(Figure{Name: fmt.Sprintf("node_rss_kb_per_identity_%d_to_%d", a.ids, c.ids), Unit: "KB", Samples: []float64{(c.mb - a.mb) * 1024 / di}})
		}
	}
}

// scaleRun is one agent serving n pods of ids service accounts.
type scaleRun struct {
	nb      *nodeBench
	n, ids  int
	ns      string
	node    string
	ca      *istioca.Server
	tb      *programtb.TB
	agent   *agentProc
	clients []*podClient
	pods    int // pods created so far, for names
	idByUID map[string]string
}

// scale measures every figure at one pod count and returns the agent's RSS
// with all streams open.
func (nb *nodeBench) scale(ctx context.Context, n, ids int, rep *Reporter) (float64, error) {
	b, opts := nb.b, nb.b.opts
	name := func(s string) string { return fmt.Sprintf("node_%d_%s", n, s) }
	s := &scaleRun{nb: nb, n: n, ids: ids, ns: fmt.Sprintf("bench-%d", n), node: fmt.Sprintf("node-%d", n), tb: programtb.New("meshbench-node")}
	defer s.close()
	if _, err := nb.kube.CreateNamespace(ctx, s.ns); err != nil {
		return 0, err
	}
	if err := parallel(ctx, ids, 8, func(i int) error {
		_, err := nb.kube.CreateServiceAccount(ctx, s.ns, fmt.Sprintf("sa-%03d", i))
		return err
	}); err != nil {
		return 0, err
	}
	started := time.Now()
	if err := parallel(ctx, n, 16, func(i int) error {
		_, err := nb.kube.CreatePod(ctx, s.ns, fmt.Sprintf("pod-%05d", i), fmt.Sprintf("sa-%03d", i%ids), s.node)
		return err
	}); err != nil {
		return 0, err
	}
	s.pods = n
	b.log("node mode: %d pods created in %v", n, time.Since(started).Round(time.Millisecond))
	agentPod, err := nb.kube.CreatePod(ctx, nodeAgentNamespace, "meshagent-"+s.node, nodeAgentAccount, s.node)
	if err != nil {
		return 0, err
	}
	token, err := nb.kube.Token(ctx, nodeAgentNamespace, nodeAgentAccount, []string{istioca.DefaultAudience}, agentPod, time.Hour)
	if err != nil {
		return 0, err
	}
	if err := programtb.Guard(func() {
		s.ca = istioca.Start(s.tb, istioca.Config{
			TrustDomain:         benchTrustDomain,
			Kube:                nb.kube.Client(),
			TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: nodeAgentNamespace, Name: nodeAgentAccount}},
		})
	}); err != nil {
		return 0, err
	}
	ttl := opts.nodeSecretTTL
	if ttl == 0 {
		ttl = 30*time.Second + time.Duration(n)*30*time.Millisecond
	}
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	cfg := agentConfig{
		Binary: opts.agent, Args: opts.agentArgs, KeyType: "ec-p256", SecretTTL: ttl,
		CAAddr: s.ca.Addr(), ServerName: istioca.DefaultServerName, XDSAddr: "127.0.0.1:1",
		RootPEM: s.ca.RootPEM(), Token: token, TrustDomain: benchTrustDomain,
		Namespace: nodeAgentNamespace, ServiceAccount: nodeAgentAccount, StatusPort: port,
		Env: []string{
			"MESHAGENT_MODE=node", "NODE_NAME=" + s.node, "KUBECONFIG=" + nb.kubeconf,
			fmt.Sprintf("MESHAGENT_CA_MAX_CONCURRENT_CSRS=%d", opts.nodeBudget),
			// The default bound on SDS streams (4,096 across all callers) is
			// below one stream per pod at 5,000 pods.
			fmt.Sprintf("MESHAGENT_SDS_MAX_STREAMS=%d", max(4096, 2*n)),
			// Every pod's certificate ahead, as the figures have always
			// measured it (by default only annotated pods get theirs ahead).
			"MESHAGENT_NODE_PREFETCH_ALL=true",
		},
	}
	dir := filepath.Join(b.baseDir, "node-"+fmt.Sprint(n))
	s.agent, err = startAgent(dir, cfg)
	if err != nil {
		return 0, err
	}
	actx, cancel := untilExit(ctx, s.agent)
	defer cancel()

	// Every identity is fetched ahead, from the pod list alone: the pods'
	// and that of the agent's own pod, which runs on the node too.
	// The CA's TokenReview and pod look-ups take tens of ms per CSR on a
	// loaded machine: allow 200 ms per identity beyond -stream-timeout.
	if err := s.waitIssued(actx, ids+1, opts.streamTimeout+time.Duration(ids)*200*time.Millisecond); err != nil {
		return 0, agentErr(s.agent, fmt.Errorf("certificates fetched ahead: %w", err))
	}
	b.log("node mode: %d identities fetched ahead %v after exec", ids, time.Since(s.agent.Started).Round(time.Millisecond))
	pods, err := nb.kube.Client().CoreV1().Pods(s.ns).List(actx, listAll())
	if err != nil {
		return 0, err
	}
	started = time.Now()
	if err := s.openClients(actx, pods.Items); err != nil {
		return 0, agentErr(s.agent, err)
	}
	b.log("node mode: %d pod processes connected and served in %v", n, time.Since(started).Round(time.Millisecond))

	csrs := s.ca.CSRs()
	issued := 0
	for _, c := range csrs {
		if c.Issued {
			issued++
		}
	}
	rep.Report(Figure{Name: name("csrs"), Unit: "CSRs", Samples: []float64{float64(len(csrs))}, Target: fmt.Sprintf("== %d identities (%d and the agent's own pod)", ids+1, ids)})
	if issued != len(csrs) {
		b.log("node mode: %d of %d CSRs refused: %s", len(csrs)-issued, len(csrs), strings.Join(s.ca.Denials(), "; "))
	}
	if err := sleepCtx(actx, opts.settle); err != nil {
		return 0, err
	}
	kb, err := rssKB(s.agent.Pid())
	if err != nil {
		return 0, err
	}
	mb := float64(kb) / 1024
	// No target: the 1,000-pod figure (62-65 MB, 0.39x SPIRE's agent at that
	// shape) is kept as it is; docs/performance.md, Node mode.
	rep.Report(Figure{Name: name("rss_mb"), Unit: "MB", Samples: []float64{mb}})
	b.log("node mode: agent memory with %d streams: %s", n, rssBreakdown(s.agent.Pid()))
	if opts.pprofDir != "" {
		b.snapshotProfiles(actx, s.agent, fmt.Sprintf("node-%d", n))
	}
	if err := s.idleConns(actx, pods.Items, rep, name); err != nil {
		rep.Fail(name("idle_conn_rss_kb"), agentErr(s.agent, err))
	}

	if err := s.rotation(actx, rep, name); err != nil {
		rep.Fail(name("rotation_all_streams_ms"), agentErr(s.agent, err))
	}
	if err := s.newPods(actx, rep, name); err != nil {
		rep.Fail(name("first_cert"), agentErr(s.agent, err))
	}
	// After the rotation, whose timing the flood would disturb.
	if len(pods.Items) > 0 {
		if err := s.refusedConns(actx, pods.Items[0], rep, name); err != nil {
			rep.Fail(name("refused_conn_peak_rss_kb"), agentErr(s.agent, err))
		}
	}
	rep.Report(Figure{Name: name("csrs_in_flight_max"), Unit: "CSRs", Samples: []float64{float64(s.ca.MaxInFlight())}, Target: fmt.Sprintf("<= %d", opts.nodeBudget)})
	return mb, nil
}

// waitIssued waits until the CA has issued want certificates.
func (s *scaleRun) waitIssued(ctx context.Context, want int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		got := 0
		for _, c := range s.ca.CSRs() {
			if c.Issued {
				got++
			}
		}
		if got >= want {
			return nil
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("%d of %d issued (refusals: %s): %w", got, want, strings.Join(s.ca.Denials(), "; "), err)
		}
	}
}

// openClients starts one podclient per pod, a few at a time, and waits for
// every stream's first certificate. Processes past -node-live-procs end once
// their stream has its certificate (the agent resolved them); their
// connections and streams stay open.
func (s *scaleRun) openClients(ctx context.Context, pods []corev1.Pod) error {
	opts := s.nb.b.opts
	s.idByUID = map[string]string{}
	for _, p := range pods {
		s.idByUID[string(p.UID)] = fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", benchTrustDomain, p.Namespace, p.Spec.ServiceAccountName)
	}
	clients := make([]*podClient, len(pods))
	err := parallel(ctx, len(pods), 8, func(i int) error {
		p, err := startPodClient(s.nb.podclient, s.agent.SDSSocket(), string(pods[i].UID))
		if err != nil {
			return err
		}
		clients[i] = p
		if _, err := p.connect(ctx); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, opts.streamTimeout)
		defer cancel()
		if _, err := p.waitFirst(wctx); err != nil {
			return err
		}
		if i >= opts.nodeLiveProcs {
			p.release()
		}
		return nil
	})
	for _, c := range clients {
		if c != nil {
			s.clients = append(s.clients, c)
		}
	}
	return err
}

// rotation waits for the next renewal of every identity (SECRET_TTL is
// short) and reports the time from the round's first CA answer to the last
// stream holding its new certificate, and each identity's time from its CA
// answer to the last of its streams.
func (s *scaleRun) rotation(ctx context.Context, rep *Reporter, name func(string) string) error {
	opts := s.nb.b.opts
	seen := len(s.ca.CSRs())
	if seen != s.ids+1 {
		return fmt.Errorf("%d CSRs before the rotation, want %d: the renewal began before the %d streams were open; raise -node-secret-ttl", seen, s.ids+1, s.n)
	}
	base := make([]int, len(s.clients))
	for i, c := range s.clients {
		keys, _, _ := c.state()
		base[i] = len(keys)
	}
	s.nb.b.log("node mode: waiting for the renewal of %d identities (SECRET_TTL=%v)", s.ids, s.agent.cfg.SecretTTL)
	wctx, cancel := context.WithTimeout(ctx, s.agent.cfg.SecretTTL+opts.streamTimeout)
	defer cancel()
	var last time.Time
	for {
		done, lastAt := 0, time.Time{}
		for i, c := range s.clients {
			keys, times, err := c.state()
			if err != nil {
				return err
			}
			if len(keys) > base[i] {
				done++
				lastAt = maxTime(lastAt, times[base[i]])
			}
		}
		if done == len(s.clients) {
			last = lastAt
			break
		}
		if err := sleepCtx(wctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("new certificate on %d of %d streams: %w", done, len(s.clients), err)
		}
	}
	round := s.ca.CSRs()[seen:]
	answered := map[string]time.Time{}
	for _, c := range round {
		if c.Issued && answered[c.Identity].IsZero() {
			answered[c.Identity] = c.Answered
		}
	}
	// Each identity: its answer to the last of its streams.
	lastOf := map[string]time.Time{}
	for i, c := range s.clients {
		_, times, _ := c.state()
		id := s.identityOf(i)
		lastOf[id] = maxTime(lastOf[id], times[base[i]])
	}
	var per []float64
	var first, lastAnswer time.Time
	for id, at := range lastOf {
		a, ok := answered[id]
		if !ok {
			return fmt.Errorf("%s reached its streams renewed, but the CA answered no renewal of it", id)
		}
		per = append(per, ms(at.Sub(a)))
		lastAnswer = maxTime(lastAnswer, a)
		if first.IsZero() || a.Before(first) {
			first = a
		}
	}
	target := ""
	if s.n == 1000 {
		target = "max <= 500"
	}
	// The target is on each identity's answer to its last stream; the
	// round as a whole spans as long as the CA takes to answer every
	// identity under the CSR budget, plus the renewal jitter.
	rep.Report(Figure{Name: name("rotation_answer_to_last_stream_ms"), Unit: "ms", Samples: per, P99: true, Target: target})
	rep.Report(Figure{Name: name("rotation_round_first_answer_to_last_stream_ms"), Unit: "ms", Samples: []float64{ms(last.Sub(first))}})
	rep.Report(Figure{Name: name("rotation_round_answers_spread_ms"), Unit: "ms", Samples: []float64{ms(lastAnswer.Sub(first))}})
	return nil
}

// identityOf is the SPIFFE ID of client i's pod (pod-<i> of sa-<i mod ids>).
func (s *scaleRun) identityOf(i int) string {
	c := s.clients[i]
	return s.idByUID[c.uid]
}

// newPods measures a new pod's first certificate: -node-new-pods pods of
// existing service accounts (the identity is cached), then as many of new
// ones (a CSR each), one at a time, each timed from its creation to its
// first certificate. The pod is created just before its process starts,
// as the kubelet starts containers of a pod the API server has just bound,
// and timed from its creation (see firstCert).
func (s *scaleRun) newPods(ctx context.Context, rep *Reporter, name func(string) string) error {
	opts := s.nb.b.opts
	misses, reads := s.ca.PodCacheMisses(), s.ca.PodReads()
	for _, kind := range []struct {
		label, target string
		sa            func(i int) string
	}{
		{"cached", "<= 20", func(i int) string { return fmt.Sprintf("sa-%03d", i%s.ids) }},
		{"csr", "<= 50", func(i int) string { return fmt.Sprintf("new-%03d", i) }},
	} {
		var lat []float64
		for i := range opts.nodeNewPods {
			sa := kind.sa(i)
			if kind.label == "csr" {
				if _, err := s.nb.kube.CreateServiceAccount(ctx, s.ns, sa); err != nil {
					return err
				}
			}
			pod, err := s.nb.kube.CreatePod(ctx, s.ns, fmt.Sprintf("pod-%05d", s.pods), sa, s.node)
			if err != nil {
				return err
			}
			created := time.Now()
			s.pods++
			d, err := s.firstCert(ctx, string(pod.UID), created)
			if err != nil {
				return fmt.Errorf("%s pod %s: %w", kind.label, pod.Name, err)
			}
			lat = append(lat, ms(d))
		}
		target := ""
		if s.n == 1000 {
			target = kind.target
		}
		rep.Report(Figure{Name: name("first_cert_" + kind.label + "_ms"), Unit: "ms", Samples: lat, P99: true, Target: target})
	}
	// What the CA itself took per new identity (TokenReview, the node
	// authorizer's look-ups in its pod cache, signing): part of
	// first_cert_csr. A pod the CA's informer had not seen yet costs a
	// wait for it there, and an API server read if it does not come.
	s.nb.b.log("node mode: for %d new identities the CA's node authorizer missed its pod cache %d times, and read the API server %d times after waiting for its informer",
		opts.nodeNewPods, s.ca.PodCacheMisses()-misses, s.ca.PodReads()-reads)
	var ca []float64
	for _, c := range s.ca.CSRs() {
		if c.Issued && strings.Contains(c.Identity, "/sa/new-") {
			ca = append(ca, ms(c.Answered.Sub(c.At)))
		}
	}
	rep.Report(Figure{Name: name("ca_answer_new_identity_ms"), Unit: "ms", Samples: ca, P99: true})
	return nil
}

// firstCert starts a process in the pod and returns the time from created
// (the API server's answer to the pod's creation) to its stream's first
// certificate: the agent's watch of the pod, its resolution of the caller
// and, for a new identity, the CSR. Starting the process and moving it into
// the pod's cgroup is inside that time too. The process and stream end.
func (s *scaleRun) firstCert(ctx context.Context, uid string, created time.Time) (time.Duration, error) {
	p, err := startPodClient(s.nb.podclient, s.agent.SDSSocket(), uid)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	if _, err := p.connect(ctx); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.nb.b.opts.streamTimeout)
	defer cancel()
	at, err := p.waitFirst(wctx)
	if err != nil {
		return 0, err
	}
	return at.Sub(created), nil
}

func (s *scaleRun) close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, c := range s.clients {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			c.Close()
			<-sem
		}()
	}
	wg.Wait()
	if s.agent != nil {
		s.agent.Stop(2 * time.Second)
	}
	s.tb.Close()
}

// parallel runs f(0..n-1) on at most width goroutines; the first error
// stops the rest from starting and is returned.
func parallel(ctx context.Context, n, width int, f func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func listAll() metav1.ListOptions { return metav1.ListOptions{} }
