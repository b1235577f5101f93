//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/meshagent/meshagent/internal/node/podindex"
	"github.com/meshagent/meshagent/test/istiod"
)

// firstSVIDImage is the node benchmark's workload (test/e2e/images/firstsvid).
const firstSVIDImage = "meshagent.test/e2e-firstsvid:e2e"

// benchSample is one pod of the node benchmark: when the benchmark asked the
// API server to create it, when the process that fetches its SVID started,
// and when that process had its first SVID. All three are read on the node's
// one clock.
type benchSample struct {
	created, started, served time.Time
	// dialed and again are the firstsvid workload's (firstSVIDLine).
	dialed time.Time
	again  time.Duration
	// pod is the pod's namespace/name.
	pod string
}

// benchShape is one way a pod gets its identity.
type benchShape struct {
	name, ns string
	// pod returns pod name of service account sa.
	pod func(name, sa string) *corev1.Pod
	// times reads, from the pod's logs on the node, when the SVID's consumer
	// started and when it first held an SVID for want.
	times func(p *corev1.Pod, want string) (benchSample, error)
	// setup prepares the shape's namespace with service accounts sas.
	setup func(t *testing.T, ns string, sas []string)
}

// TestBenchNode is make bench-node: how long a new pod waits for its first
// SVID on the real node, for four ways of getting it (docs/performance.md,
// "A pod's first SVID on a real node"). It runs only when
// MESHAGENT_BENCH_NODE=1; BENCH_NODE_PODS pods per shape (50), each of its
// own service account, BENCH_NODE_PARALLEL created at once (1: each pod
// alone on the node, so the figures are one pod's path, not the kubelet's
// queue). The four shapes:
//   - the node agent, the pod annotated meshagent.io/prefetch: "true";
//   - the node agent, annotated "false" (its first request makes the CSR);
//   - the pod agent of docs/istio.md (meshagent-pod), Envoy's stand-in
//     fetching from it through pilot-agent's socket handling;
//   - Istio's own: an injected pod whose pilot-agent makes the CSR to
//     istiod, Envoy's stand-in fetching from pilot-agent.
//
// Created is read just before the Create call; started and served inside
// the pod: the firstsvid workload's main (node agent shapes) or the Envoy
// stand-in's start (the others), and the first SVID each held. The CSRs are
// istiod's citadel_server_csr_count over the shape.
func TestBenchNode(t *testing.T) {
	if os.Getenv("MESHAGENT_BENCH_NODE") != "1" {
		t.Skip("the node benchmark runs with MESHAGENT_BENCH_NODE=1 (make bench-node)")
	}
	pods := benchEnvInt(t, "BENCH_NODE_PODS", 50)
	parallel := benchEnvInt(t, "BENCH_NODE_PARALLEL", 1)
	ctx := context.Background()
	core := kube.Client().CoreV1()

	tar, err := buildImage(repoRoot(), t.TempDir(), "./test/e2e/images/firstsvid", firstSVIDImage, "/usr/local/bin/firstsvid")
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.ImportImage(tar); err != nil {
		t.Fatal(err)
	}
	controlPlane(t)
	injectionWebhook(t, waitRoots(t, istiod.Namespace))

	// The node agent as docs/kubernetes.md installs it.
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	waitRoots(t, agentNamespace)
	// With BENCH_NODE_AGENT_DEBUG=1 the agent logs each caller resolved and
	// each response sent: the node agent's shapes are then split into the
	// client's and the agent's parts (agentSteps).
	debug := os.Getenv("BENCH_NODE_AGENT_DEBUG") == "1"
	install := []string{"install", release, filepath.Join(repoRoot(), "deploy", "helm", "meshagent"),
		"--namespace", agentNamespace,
		"--set", "sidecar.enabled=false,node.enabled=true,image.pullPolicy=Never",
		"--set", "caAddress=" + istiodAddr,
		"--set", "istiodSAN=" + caServerName,
		"--wait", "--timeout", "3m"}
	if debug {
		install = append(install, "--set", "extraEnv[0].name=MESHAGENT_LOG_LEVEL,extraEnv[0].value=debug")
	}
	run(t, "helm", install...)
	t.Cleanup(func() {
		if _, err := kube.Command(context.Background(), "helm", "uninstall", release, "--namespace", agentNamespace, "--wait", "--timeout", "2m").CombinedOutput(); err != nil {
			t.Logf("helm uninstall: %v", err)
		}
	})
	agent := agentPod(t, "")

	nodeSetup := func(t *testing.T, ns string, sas []string) {
		if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		benchAccounts(t, ns, sas)
	}
	meshSetup := func(t *testing.T, ns string, sas []string) {
		meshNamespace(t, ns, sas[0])
		benchAccounts(t, ns, sas[1:])
	}
	// The stand-in holds one SDS stream as Envoy does: its first answer is
	// printed when it comes, not at the next poll.
	stream := `{"proxyMetadata":{"ENVOY_STANDIN_SDS_STREAM":"true"}}`
	shapes := []benchShape{
		{
			name: "node agent, fetched ahead", ns: "bench-ahead", setup: nodeSetup,
			pod:   func(name, sa string) *corev1.Pod { return firstSVIDPod("bench-ahead", name, sa, "true") },
			times: firstSVIDTimes,
		},
		{
			name: "node agent, not fetched ahead", ns: "bench-cold", setup: nodeSetup,
			pod:   func(name, sa string) *corev1.Pod { return firstSVIDPod("bench-cold", name, sa, "false") },
			times: firstSVIDTimes,
		},
		{
			name: "pod agent (meshagent-pod)", ns: "bench-podagent", setup: meshSetup,
			pod: func(name, sa string) *corev1.Pod {
				return injectedPod("bench-podagent", name, sa, "sidecar,meshagent-pod", map[string]string{
					"sidecar.istio.io/nativeSidecar":         "false",
					"sidecar.istio.io/rewriteAppHTTPProbers": "false",
					"proxy.istio.io/config":                  stream,
				})
			},
			times: standInTimes,
		},
		{
			name: "Istio: pilot-agent's CSR to istiod", ns: "bench-istio", setup: meshSetup,
			pod: func(name, sa string) *corev1.Pod {
				return injectedPod("bench-istio", name, sa, "sidecar", map[string]string{"proxy.istio.io/config": stream})
			},
			times: standInTimes,
		},
	}
	if only := os.Getenv("BENCH_NODE_SHAPES"); only != "" {
		shapes = slices.DeleteFunc(shapes, func(s benchShape) bool { return !strings.Contains(","+only+",", ","+s.ns+",") })
	}

	var table []string
	for _, s := range shapes {
		sas := make([]string, pods)
		for i := range sas {
			sas[i] = fmt.Sprintf("sa-%d", i)
		}
		s.setup(t, s.ns, sas)
		before := istiodCSRs(t)
		start := time.Now()
		samples := benchPods(t, s, sas, parallel)
		csrs := istiodCSRs(t) - before
		t.Logf("%s: %d pods in %.1fs", s.name, len(samples), time.Since(start).Seconds())
		if !samples[0].dialed.IsZero() {
			t.Logf("%s (ms, p50 / p99): started → socket dialed %s, dialed → first SVID %s, a second fetch at once %s", s.name,
				benchCol(samples, func(s benchSample) time.Duration { return s.dialed.Sub(s.started) }),
				benchCol(samples, func(s benchSample) time.Duration { return s.served.Sub(s.dialed) }),
				benchCol(samples, func(s benchSample) time.Duration { return s.again }))
			if debug {
				agentSteps(t, s.name, agent, samples)
			}
		}
		table = append(table, benchRow(s.name, samples, csrs))
		if err := core.Namespaces().Delete(ctx, s.ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitGone(t, "the pods of "+s.ns, func() bool {
			l, err := core.Pods(s.ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0
		})
	}
	out := fmt.Sprintf("\nBENCH-NODE %d pods per shape, %d created at once (ms, nearest rank: p99 of %d is its %s)\n",
		pods, parallel, pods, benchRank(pods))
	out += "| shape | created → container started p50 / p99 | container started → first SVID p50 / p99 | created → first SVID p50 / p99 | CSRs istiod counted |\n"
	out += "|---|---|---|---|---|\n"
	out += strings.Join(table, "\n") + "\n"
	fmt.Print(out)
	if path := os.Getenv("BENCH_NODE_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func benchEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func benchAccounts(t *testing.T, ns string, sas []string) {
	t.Helper()
	for _, sa := range sas {
		if _, err := kube.Client().CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// benchPods creates one pod per service account, parallel at a time, each
// deleted once it has its SVID, and returns their samples.
func benchPods(t *testing.T, s benchShape, sas []string, parallel int) []benchSample {
	t.Helper()
	var (
		mu      sync.Mutex
		samples []benchSample
		errs    []string
		wg      sync.WaitGroup
	)
	next := make(chan int)
	for range parallel {
		wg.Go(func() {
			for i := range next {
				sample, err := benchPod(s, fmt.Sprintf("p%d", i), sas[i])
				mu.Lock()
				if err != nil {
					errs = append(errs, err.Error())
				} else {
					samples = append(samples, sample)
				}
				mu.Unlock()
			}
		})
	}
	for i := range sas {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%s: %d of %d pods failed:\n%s", s.name, len(errs), len(sas), strings.Join(errs, "\n"))
	}
	return samples
}

func benchPod(s benchShape, name, sa string) (benchSample, error) {
	ctx := context.Background()
	pods := kube.Client().CoreV1().Pods(s.ns)
	created := time.Now()
	p, err := pods.Create(ctx, s.pod(name, sa), metav1.CreateOptions{})
	if err != nil {
		return benchSample{}, fmt.Errorf("%s: creating: %w", name, err)
	}
	defer func() { _ = pods.Delete(ctx, name, metav1.DeleteOptions{}) }()
	want := spiffeIDIn(s.ns, sa)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		sample, err := s.times(p, want)
		if err != nil {
			return benchSample{}, fmt.Errorf("%s: %w", name, err)
		}
		if !sample.served.IsZero() {
			sample.created, sample.pod = created, s.ns+"/"+name
			return sample, nil
		}
		if time.Now().After(deadline) {
			return benchSample{}, fmt.Errorf("%s: no SVID within 3 minutes", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// firstSVIDPod is a pod of the firstsvid workload on the node agent's CSI
// volume; prefetch is its meshagent.io/prefetch annotation.
func firstSVIDPod(ns, name, sa, prefetch string) *corev1.Pod {
	p := clientPod(name, sa)
	p.Namespace = ns
	p.Annotations = map[string]string{podindex.PrefetchAnnotation: prefetch}
	c := &p.Spec.Containers[0]
	c.Image = firstSVIDImage
	c.Env = []corev1.EnvVar{{Name: "SOCKET", Value: socketMount + "/socket"}, {Name: "RETRY", Value: "5ms"}}
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	return p
}

// firstSVIDLine is the firstsvid workload's line.
type firstSVIDLine struct {
	Started  time.Time     `json:"started"`
	Served   time.Time     `json:"served"`
	SpiffeID string        `json:"spiffe_id"`
	Attempts int           `json:"attempts"`
	Error    string        `json:"error"`
	Dialed   time.Time     `json:"dialed"`
	Again    time.Duration `json:"again_ns"`
}

func firstSVIDTimes(p *corev1.Pod, want string) (benchSample, error) {
	for _, l := range jsonLines(p, "client", func(l firstSVIDLine) bool { return !l.Started.IsZero() }) {
		if l.Served.IsZero() {
			return benchSample{}, fmt.Errorf("no SVID after %d attempts: %s", l.Attempts, l.Error)
		}
		if l.SpiffeID != want {
			return benchSample{}, fmt.Errorf("served %s, want %s", l.SpiffeID, want)
		}
		return benchSample{started: l.Started, served: l.Served, dialed: l.Dialed, again: l.Again}, nil
	}
	return benchSample{}, nil
}

// standInTimes reads when the Envoy stand-in started and when its SDS stream
// first held the pod's certificate.
func standInTimes(p *corev1.Pod, want string) (benchSample, error) {
	var s benchSample
	for _, l := range standInLines(p) {
		switch {
		case l.Kind == "start" && s.started.IsZero():
			s.started = l.Time
		case l.Kind == "sds" && l.SpiffeID != "" && l.SpiffeID != want:
			return benchSample{}, fmt.Errorf("the stand-in got %s, want %s", l.SpiffeID, want)
		case l.Kind == "sds" && l.Serial != "" && s.served.IsZero():
			s.served = l.Time
		}
	}
	if s.started.IsZero() {
		return benchSample{}, nil
	}
	return s, nil
}

// agentLine is a line of the node agent's debug log.
type agentLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
	Cred string    `json:"cred"`
	Pod  string    `json:"pod"`
}

// agentSteps logs, from the node agent's debug log, where each pod's first
// fetch spent its time: from the workload's plain connection to the agent
// resolving the caller of the fetch's connection (the client's gRPC set-up,
// the connection accepted and its caller resolved), from there to the
// agent's first response sent (HTTP/2 handshake, the request, the agent's
// serving), and from there to the SVID in the workload's hand.
func agentSteps(t *testing.T, shape string, agent *corev1.Pod, samples []benchSample) {
	t.Helper()
	lines := jsonLines(agent, "meshagent", func(l agentLine) bool {
		return l.Msg == "caller resolved" || l.Msg == "workload API response sent"
	})
	var before, serving, after []benchSample
	for _, s := range samples {
		var cred string
		var resolved, sent time.Time
		for _, l := range lines {
			switch {
			case l.Msg == "caller resolved" && l.Pod == s.pod:
				cred, resolved = l.Cred, l.Time
			case l.Msg == "workload API response sent" && cred != "" && l.Cred == cred:
				sent = l.Time
			}
			if !sent.IsZero() {
				break
			}
		}
		if sent.IsZero() {
			t.Logf("%s: no response to %s in the agent's log", shape, s.pod)
			continue
		}
		before = append(before, benchSample{started: s.dialed, served: resolved})
		serving = append(serving, benchSample{started: resolved, served: sent})
		after = append(after, benchSample{started: sent, served: s.served})
	}
	if len(before) == 0 {
		return
	}
	d := func(s benchSample) time.Duration { return s.served.Sub(s.started) }
	t.Logf("%s (ms, p50 / p99, %d pods): dialed → the fetch's caller resolved %s, → response sent %s, → SVID in hand %s",
		shape, len(before), benchCol(before, d), benchCol(serving, d), benchCol(after, d))
}

// benchRow is one line of the table: p50 / p99 of each interval, in ms.
func benchRow(name string, samples []benchSample, csrs int) string {
	col := func(d func(s benchSample) time.Duration) string { return benchCol(samples, d) }
	return fmt.Sprintf("| %s | %s | %s | %s | %d |", name,
		col(func(s benchSample) time.Duration { return s.started.Sub(s.created) }),
		col(func(s benchSample) time.Duration { return s.served.Sub(s.started) }),
		col(func(s benchSample) time.Duration { return s.served.Sub(s.created) }),
		csrs)
}

// benchCol is "p50 / p99" of d over samples, in ms.
func benchCol(samples []benchSample, d func(s benchSample) time.Duration) string {
	ms := make([]float64, len(samples))
	for i, s := range samples {
		ms[i] = float64(d(s)) / float64(time.Millisecond)
	}
	slices.Sort(ms)
	return fmt.Sprintf("%s / %s", benchMS(quantile(ms, 0.50)), benchMS(quantile(ms, 0.99)))
}

// benchRank names the sample the p99 of n is.
func benchRank(n int) string {
	if k := int(math.Ceil(0.99 * float64(n))); k < n {
		return fmt.Sprintf("%d-th slowest", n-k+1)
	}
	return "slowest"
}

// quantile is the nearest-rank quantile q of sorted.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func benchMS(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
