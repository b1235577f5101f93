package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// shellAgent runs script under /bin/sh in place of the agent, to exercise
// process handling without the agent binary.
func shellAgent(t *testing.T, script string) *agentProc {
	t.Helper()
	a, err := startAgent(t.TempDir(), agentConfig{Binary: "/bin/sh", Args: []string{"-c", script}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop(0) })
	return a
}

func TestAgentStopsOnTERM(t *testing.T) {
	a := shellAgent(t, `trap 'echo stopping; exit 0' TERM; echo started; while :; do sleep 0.01; done`)
	waitLog(t, a, "started")
	a.Stop(time.Minute)
	select {
	case <-a.Exited():
	default:
		t.Fatal("not exited after Stop")
	}
	// It ended by its TERM handler (status 0), not by the kill after the grace.
	if err := a.ExitErr(); err == nil || err.Error() != "agent exited with status 0" {
		t.Errorf("exit: %v, want status 0", err)
	}
	if !strings.Contains(a.LogTail(), "stopping") {
		t.Errorf("log %q: TERM handler did not run", a.LogTail())
	}
	if err := syscall.Kill(a.Pid(), 0); err == nil {
		t.Errorf("pid %d still exists", a.Pid())
	}
	a.Stop(time.Second) // twice is fine
}

func TestAgentKilledAfterGrace(t *testing.T) {
	a := shellAgent(t, `trap 'echo got TERM' TERM; echo started; while :; do sleep 0.01; done`)
	waitLog(t, a, "started")
	a.Stop(time.Second)
	// TERM came first and was survived; the kill ended it.
	if !strings.Contains(a.LogTail(), "got TERM") {
		t.Errorf("log %q: no TERM before the kill", a.LogTail())
	}
	if err := a.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("exit: %v", err)
	}
}

func TestKillAll(t *testing.T) {
	a := shellAgent(t, `trap '' TERM; while :; do sleep 0.01; done`)
	b := shellAgent(t, `while :; do sleep 0.01; done`)
	killAll()
	for _, p := range []*agentProc{a, b} {
		select {
		case <-p.Exited():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still running after killAll", p)
		}
	}
	live.Lock()
	n := len(live.procs)
	live.Unlock()
	if n != 0 {
		t.Errorf("%d processes still tracked", n)
	}
}

func TestAgentExitSeen(t *testing.T) {
	a := shellAgent(t, `echo "bad config" >&2; exit 2`)
	select {
	case <-a.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("exit not seen")
	}
	err := agentErr(a, os.ErrDeadlineExceeded)
	if !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "bad config") {
		t.Errorf("agentErr = %v", err)
	}
	if got := a.SDSSocket(); !filepath.IsAbs(got) || !strings.HasSuffix(got, "/var/run/secrets/workload-spiffe-uds/socket") {
		t.Errorf("SDS socket %s", got)
	}
}

func TestStartAgentMissingBinary(t *testing.T) {
	if _, err := startAgent(t.TempDir(), agentConfig{Binary: filepath.Join(t.TempDir(), "nope")}); err == nil {
		t.Fatal("started a binary that does not exist")
	}
}

// waitLog polls the agent's log until it holds s.
func waitLog(t *testing.T, a *agentProc, s string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if strings.Contains(a.LogTail(), s) {
			return
		}
	}
	t.Fatalf("log never said %q: %q", s, a.LogTail())
}
