package test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
)

// peekEnv makes the test binary a peeking child: it reads the memory of
// the process whose pid the variable holds.
const peekEnv = "MESHAGENT_TEST_PEEK_PID"

// peekUID runs the agent and the peeking child: the same uid, no
// capabilities, as a non-root process of a hostPID pod would be.
const peekUID = 4711

// peek reads /proc/<pid>/environ and a page of /proc/<pid>/mem, and prints
// "read" or "refused <error>".
func peek(pid string) int {
	if _, err := os.ReadFile("/proc/" + pid + "/environ"); err != nil {
		fmt.Println("refused", err)
		return 0
	}
	maps, err := os.Open("/proc/" + pid + "/maps")
	if err != nil {
		fmt.Println("refused", err)
		return 0
	}
	defer maps.Close()
	line, err := bufio.NewReader(maps).ReadString('\n')
	if err != nil {
		fmt.Println("refused", err)
		return 0
	}
	start, err := strconv.ParseUint(line[:strings.IndexByte(line, '-')], 16, 64)
	if err != nil {
		fmt.Println("maps:", err)
		return 2
	}
	mem, err := os.Open("/proc/" + pid + "/mem")
	if err != nil {
		fmt.Println("refused", err)
		return 0
	}
	defer mem.Close()
	if _, err := mem.ReadAt(make([]byte, 4096), int64(start)); err != nil {
		fmt.Println("refused", err)
		return 0
	}
	fmt.Println("read")
	return 0
}

var asPeekUID = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: peekUID, Gid: peekUID}}

// peekAt runs the peeking child, a copy of the test binary in bin, as
// peekUID against pid and returns what it printed.
func peekAt(t *testing.T, bin string, pid int) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{peekEnv + "=" + strconv.Itoa(pid)}
	cmd.SysProcAttr = asPeekUID
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("peeking child: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// The agent holds private keys: a process of its own uid without
// CAP_SYS_PTRACE (another container of that uid in a hostPID pod; a root one
// where the agent runs as root without capabilities) cannot read its memory.
// The same child reads a dumpable process of that uid, so the refusal is
// the agent's own doing (prctl PR_SET_DUMPABLE 0 at start).
func TestAgentMemoryUnreadableWithoutPtraceCapability(t *testing.T) {
	dir := agentproc.TempDir(t)
	chownAll(t, dir, peekUID)
	p := agentproc.StartAs(t, asPeekUID.Credential, dir, flEnv("MESHAGENT_DEV=true")...)
	testwait.Within(t, 15*time.Second, "the agent's socket", func() bool {
		_, err := os.Stat(p.Socket())
		return err == nil
	})

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	binDir := agentproc.TempDir(t)
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "peek")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}

	control := exec.Command("sleep", "3600")
	control.SysProcAttr = asPeekUID
	if err := control.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = control.Process.Kill(); _ = control.Wait() })
	if got := peekAt(t, bin, control.Process.Pid); got != "read" {
		t.Fatalf("the child could not read a dumpable process of its uid (%q): the test proves nothing", got)
	}
	got := peekAt(t, bin, p.Pid())
	if !strings.HasPrefix(got, "refused") || !strings.Contains(got, "permission denied") {
		t.Fatalf("reading the agent's memory as its uid without CAP_SYS_PTRACE: %q, want permission denied", got)
	}
}
