package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/kubeenv"
	"github.com/meshagent/meshagent/test/podproc"
	"github.com/meshagent/meshagent/test/programtb"
)

// The hostile-pods phase: the agent in node mode, its pods' processes in
// kubelet-shaped cgroups, against a real API server (test/kubeenv) and the
// test CA applying istiod's node authorizer. Good pods fetch their
// certificate over and over while hostile pods of the same node flood the
// agent with idle connections, flood one connection whose HTTP/2 window is
// 0 with FetchSecrets, and have their identity refused by the CA; one pod
// is deleted under an open stream.
const (
	podsNode = "soak-node"
	podsNS   = "soakpods"
	// floodConns idle connections from one pod (all but the per-caller
	// limit refused at their handshake); zeroCalls FetchSecrets on one
	// window-0 connection, each followed by empty SETTINGS frames.
	floodConns = 5000
	zeroCalls  = 20000
	// refusalLinesBound bounds the agent's log lines of refused
	// connections over the phase.
	refusalLinesBound = 200
	// podsRSSBoundKB is the agent's RSS bound during the phase.
	podsRSSBoundKB = 160 << 10
	// goodFetchBound is how long a good pod's fetch (connect and
	// FetchSecrets) may take once its identity has a certificate.
	goodFetchBound = 2 * time.Second
	// leaveBound is how long a deleted pod's open stream may last.
	leaveBound = 15 * time.Second
)

// podFigures are what the phase measured.
type podFigures struct {
	skipped                     string
	rssBase, rssPeak, rssEnd    int64
	goodFetches, goodSlow       int
	goodMax                     time.Duration
	refusedFetches, refusedOK   int
	floodHeld, zeroSent         string
	refusalLines                int
	leaveEnded                  string
	leaveAfter                  string
	goodCSRs, goodCSRsNotIssued int
	refusedCSRs                 int
}

// podProc is one pod's client process.
type podProc struct {
	name  string
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	mu    sync.Mutex
	lines []string
	seen  chan struct{} // a line arrived
}

func (p *podProc) read(sc *bufio.Scanner) {
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		p.mu.Unlock()
		select {
		case p.seen <- struct{}{}:
		default:
		}
	}
}

func (p *podProc) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// first returns the first line starting with prefix, waiting up to d.
func (p *podProc) first(prefix string, d time.Duration) (string, bool) {
	deadline := time.Now().Add(d)
	for {
		for _, l := range p.all() {
			if strings.HasPrefix(l, prefix) {
				return l, true
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return "", false
		}
		select {
		case <-p.seen:
		case <-time.After(min(left, 200*time.Millisecond)):
		}
	}
}

// runPods runs the phase for d. It returns the figures; f.skipped says why
// the phase could not run (no API server binaries, not root).
func runPods(ctx context.Context, binary string, d time.Duration, led *ledger, logf func(string, ...any)) (f podFigures) {
	if os.Geteuid() != 0 {
		f.skipped = "needs root to make pod cgroups"
		return f
	}
	if _, err := kubeenv.ToolPath("kube-apiserver"); err != nil {
		f.skipped = "no kube-apiserver (run scripts/tools.sh): " + err.Error()
		return f
	}
	env, err := kubeenv.Start(ctx, kubeenv.Options{})
	if err != nil {
		f.skipped = "starting the API server: " + err.Error()
		return f
	}
	defer env.Stop()
	tb := programtb.New("meshsoak-pods")
	defer func() {
		defer func() { _ = recover() }() // a cgroup left behind is reported by podproc, not fatal here
		tb.Close()
	}()
	var ca *istioca.Server
	pods := map[string]*corev1.Pod{}
	err = programtb.Guard(func() {
		if _, err := env.CreateNamespace(ctx, podsNS); err != nil {
			tb.Fatal(err)
		}
		for _, sa := range []string{"meshagent", "good-a", "good-b", "refused", "flood", "zero", "leaving"} {
			if _, err := env.CreateServiceAccount(ctx, podsNS, sa); err != nil {
				tb.Fatal(err)
			}
			p, err := env.CreatePod(ctx, podsNS, sa+"-0", sa, podsNode)
			if err != nil {
				tb.Fatal(err)
			}
			pods[sa] = p
		}
		ca = istioca.Start(tb, istioca.Config{Kube: env.Client(), TrustedNodeAccounts: []istioca.ServiceAccount{{Namespace: podsNS, Name: "meshagent"}}})
	})
	if err != nil {
		led.Violate("pods_setup", "%v", err)
		return f
	}
	ca.RefuseIdentity(spiffeOf("refused"), codes.PermissionDenied)
	a, err := startNodeAgent(ctx, binary, env, ca, pods["meshagent"])
	if err != nil {
		led.Violate("pods_setup", "%v", err)
		return f
	}
	defer os.RemoveAll(a.dir)
	defer a.stop(5 * time.Second)
	f.rssBase, _ = rssKB(a.pid())
	logf("pods phase: node agent pid %d, rss %d kB", a.pid(), f.rssBase)

	self, err := os.Executable()
	if err != nil {
		led.Violate("pods_setup", "%v", err)
		return f
	}
	socket := a.path(sdsSocket)
	var procs []*podProc
	start := func(sa, mode string, n int, shape podproc.Shape) *podProc {
		var p *podProc
		err := programtb.Guard(func() { p = startPodProc(tb, self, socket, sa, mode, n, string(pods[sa].UID), shape) })
		if err != nil {
			led.Violate("pods_setup", "%s: %v", sa, err)
			return nil
		}
		procs = append(procs, p)
		return p
	}
	defer func() {
		for _, p := range procs {
			_ = p.stdin.Close()
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	}()
	goodA := start("good-a", "fetch", 0, podproc.Cgroupfs)
	goodB := start("good-b", "fetch", 0, podproc.Systemd)
	refused := start("refused", "fetch", 0, podproc.Cgroupfs)
	leaving := start("leaving", "stream", 0, podproc.Cgroupfs)
	if goodA == nil || goodB == nil || refused == nil || leaving == nil {
		return f
	}
	// Let the good identities get their first certificate, then flood.
	for _, p := range []*podProc{goodA, goodB} {
		if _, ok := p.first("ok ", 30*time.Second); !ok {
			led.Violate("pods_good", "%s never got a certificate: %v", p.name, tailLines(p.all(), 3))
		}
	}
	warm := map[*podProc]int{goodA: len(goodA.all()), goodB: len(goodB.all())}
	flood := start("flood", "flood", floodConns, podproc.Cgroupfs)
	zero := start("zero", "zero", zeroCalls, podproc.Systemd)

	phaseCtx, end := context.WithTimeout(ctx, d)
	defer end()
	deleteAt := time.Now().Add(d / 2)
	deleted := false
	var deletedAt time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for phaseCtx.Err() == nil {
		select {
		case <-phaseCtx.Done():
		case <-tick.C:
		}
		if err := a.exitedErr(); err != nil {
			led.Violate("pods_agent_exited", "%v", err)
			break
		}
		if rss, err := rssKB(a.pid()); err == nil {
			f.rssPeak = max(f.rssPeak, rss)
		}
		if !deleted && time.Now().After(deleteAt) && phaseCtx.Err() == nil {
			zero64 := int64(0)
			if err := env.Client().CoreV1().Pods(podsNS).Delete(ctx, pods["leaving"].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero64}); err != nil {
				led.Violate("pods_setup", "deleting leaving-0: %v", err)
			}
			deleted, deletedAt = true, time.Now()
		}
	}
	f.rssEnd, _ = rssKB(a.pid())

	// Invariants.
	if f.rssPeak > podsRSSBoundKB {
		led.Violate("pods_rss", "agent RSS peaked at %d kB under hostile pods (bound %d kB)", f.rssPeak, podsRSSBoundKB)
	}
	for _, p := range []*podProc{goodA, goodB} {
		want := spiffeOf(p.name)
		for i, l := range p.all() {
			fields := strings.Fields(l)
			if len(fields) < 3 {
				continue
			}
			ms, _ := strconv.Atoi(fields[1])
			took := time.Duration(ms) * time.Millisecond
			if i < warm[p] {
				continue
			}
			f.goodFetches++
			f.goodMax = max(f.goodMax, took)
			switch {
			case fields[0] != "ok":
				led.Violate("pods_good", "%s: %s", p.name, l)
			case fields[2] != want:
				led.Violate("pods_good", "%s got %s, want %s", p.name, fields[2], want)
			case took > goodFetchBound:
				f.goodSlow++
				led.Violate("pods_good_latency", "%s: fetch took %s (bound %s)", p.name, took, goodFetchBound)
			}
		}
	}
	for _, l := range refused.all() {
		f.refusedFetches++
		if strings.HasPrefix(l, "ok ") {
			f.refusedOK++
			led.Violate("pods_refused", "the refused identity was served: %s", l)
		}
	}
	if flood != nil {
		f.floodHeld, _ = flood.first("held ", 0)
	}
	// The flood's refusals are logged a few lines per caller and 10 s, not
	// one each.
	if b, err := os.ReadFile(a.path(agentLog)); err == nil {
		f.refusalLines = strings.Count(string(b), `"msg":"local client refused`)
		if f.refusalLines > refusalLinesBound {
			led.Violate("pods_refusal_log", "%d log lines of refused connections (bound %d)", f.refusalLines, refusalLinesBound)
		}
	}
	if zero != nil {
		f.zeroSent, _ = zero.first("sent ", 0)
	}
	if deleted {
		if l, ok := leaving.first("ended ", time.Until(deletedAt.Add(leaveBound))); ok {
			f.leaveEnded = l
			f.leaveAfter, _ = leaving.first("after ", 10*time.Second)
			if !strings.HasPrefix(f.leaveAfter, "after err") {
				led.Violate("pods_leaving", "a deleted pod's connection was served again: %q", f.leaveAfter)
			}
		} else {
			f.leaveEnded = "still open"
			led.Violate("pods_leaving", "a deleted pod's stream was still open %s after the deletion", leaveBound)
		}
	}
	for _, r := range ca.CSRs() {
		switch r.Identity {
		case spiffeOf("good-a"), spiffeOf("good-b"):
			f.goodCSRs++
			if !r.Issued && !r.Answered.IsZero() {
				f.goodCSRsNotIssued++
			}
		case spiffeOf("refused"):
			f.refusedCSRs++
		}
	}
	if f.goodCSRsNotIssued > 0 {
		led.Violate("pods_csr_disturbed", "%d CSRs of good identities failed (and were retried) beside a refused identity", f.goodCSRsNotIssued)
	}
	return f
}

func spiffeOf(sa string) string { return "spiffe://" + soakDomain + "/ns/" + podsNS + "/sa/" + sa }

// startPodProc starts meshsoak again as a pod client of sa's pod, moves it
// into the pod's cgroup, and gives it the go-ahead.
func startPodProc(tb *programtb.TB, self, socket, sa, mode string, n int, uid string, shape podproc.Shape) *podProc {
	cmd := exec.Command(self)
	cmd.Env = []string{podModeEnv + "=" + mode, podSocketEnv + "=" + socket, podCountEnv + "=" + strconv.Itoa(n)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &podProc{name: sa, cmd: cmd, stdin: stdin, seen: make(chan struct{}, 1)}
	podproc.Move(tb, cmd.Process.Pid, shape, uid, podproc.ContainerID(len(sa)))
	// Cleanups run newest first: the process dies before its cgroup goes.
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	go p.read(sc)
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		tb.Fatal(err)
	}
	return p
}

// startNodeAgent runs the agent in node mode for podsNode, authenticated to
// ca by a pod-bound token of its own service account.
func startNodeAgent(ctx context.Context, binary string, env *kubeenv.Env, ca *istioca.Server, self *corev1.Pod) (*agent, error) {
	dir, err := os.MkdirTemp("", "meshsoak-node-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	tok, err := env.Token(ctx, podsNS, "meshagent", []string{istioca.DefaultAudience}, self, time.Hour)
	if err != nil {
		return nil, fmt.Errorf("agent token: %w", err)
	}
	for name, data := range map[string][]byte{"istio-token": []byte(tok), "root-cert.pem": ca.RootPEM()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	if err := env.Kubeconfig(filepath.Join(dir, "kubeconfig"), env.AdminToken()); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, agentLog))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(binary, "run")
	cmd.Dir = dir
	cmd.Env = []string{
		"MESHAGENT_MODE=node", "NODE_NAME=" + podsNode,
		"KUBECONFIG=" + filepath.Join(dir, "kubeconfig"),
		"CA_ADDR=" + ca.Addr(), "ISTIOD_SAN=" + istioca.DefaultServerName,
		"CA_ROOT_CA=" + filepath.Join(dir, "root-cert.pem"),
		"MESHAGENT_TOKEN_PATH=" + filepath.Join(dir, "istio-token"),
		"POD_NAMESPACE=" + podsNS, "SERVICE_ACCOUNT=meshagent", "POD_NAME=" + self.Name,
		"STATUS_PORT=" + strconv.Itoa(port), "MESHAGENT_STATUS_HOST=127.0.0.1",
		"SECRET_TTL=" + secretTTL.String(), "MESHAGENT_LOG_LEVEL=info",
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &agent{dir: dir, statusPort: port, cmd: cmd, exited: make(chan struct{})}
	go func() {
		a.waitErr = cmd.Wait()
		close(a.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(a.path(sdsSocket)); err == nil {
			return a, nil
		}
		if err := a.exitedErr(); err != nil || time.Now().After(deadline) {
			a.stop(time.Second)
			return nil, errors.Join(errors.New("the node agent did not make its socket"), err, errors.New(tail(a.path(agentLog))))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tailLines(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// reportPods prints the hostile-pods phase. Which invariants need the
// per-caller limits and the closing of a leaving pod's connections is said
// where they are printed.
func reportPods(w io.Writer, f podFigures) {
	if f.skipped != "" {
		fmt.Fprintf(w, "SOAK pods skipped: %s\n", f.skipped)
		return
	}
	fmt.Fprintf(w, "SOAK pods rss base %d kB peak %d kB end %d kB (bound %d kB)\n", f.rssBase, f.rssPeak, f.rssEnd, podsRSSBoundKB)
	fmt.Fprintf(w, "SOAK pods flood %q zero_window %q refusal_log_lines %d (bound %d)\n", f.floodHeld, f.zeroSent, f.refusalLines, refusalLinesBound)
	fmt.Fprintf(w, "SOAK pods good fetches %d slowest %s over bound %d (bound %s)\n", f.goodFetches, f.goodMax.Round(time.Millisecond), f.goodSlow, goodFetchBound)
	fmt.Fprintf(w, "SOAK pods refused fetches %d served %d, CSRs refused identity %d good %d failed %d\n", f.refusedFetches, f.refusedOK, f.refusedCSRs, f.goodCSRs, f.goodCSRsNotIssued)
	fmt.Fprintf(w, "SOAK pods leaving stream %q then %q (bound %s)\n", f.leaveEnded, f.leaveAfter, leaveBound)
}
