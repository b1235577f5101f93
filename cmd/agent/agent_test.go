package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinary builds meshagent and runs it as a process: bad configuration
// exits 2 with one line, and the dev agent answers /healthz/live and stops
// cleanly on SIGTERM and SIGINT.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "meshagent")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("bad CA_PROVIDER exits 2", func(t *testing.T) {
		cmd := exec.Command(bin, "run")
		cmd.Dir = t.TempDir()
		cmd.Env = []string{"CA_PROVIDER=Bogus"}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("err %v, output %q", err, out)
		}
		if string(out) != "invalid CA_PROVIDER=\"Bogus\": accepted: Citadel, Linkerd\n" {
			t.Errorf("output %q", out)
		}
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run("dev agent stops on "+sig.String(), func(t *testing.T) {
			cmd := exec.Command(bin, "run", "--dev")
			cmd.Dir = t.TempDir()
			// No drain: this is about stopping cleanly (test/drain_test.go drains).
			cmd.Env = []string{"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1", `PROXY_CONFIG={"terminationDrainDuration":"0s"}`}
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			addr := make(chan string, 1)
			var logs strings.Builder
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					logs.WriteString(sc.Text() + "\n")
					var line struct{ Msg, Addr string }
					if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "status server listening" {
						addr <- line.Addr
					}
				}
				exited <- cmd.Wait()
			}()
			select {
			case a := <-addr:
				if code, body := httpGet(t, "http://"+a+"/healthz/live"); code != 200 {
					t.Errorf("live: %d %q", code, body)
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("no status server")
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("exit: %v\n%s", err, logs.String())
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("agent did not stop")
			}
		})
	}
}
