package nodemode

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/test/heavy"
	"github.com/meshagent/meshagent/test/podproc"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// childEnv makes the test binary a caller of the agent's socket it names:
// it reads commands from stdin, one a line, and answers each with one line
// on stdout:
//
//	fetch <seconds> <name>...  one Fetch on a new connection: "ok <URI SAN>..." or "error <code> <message>"
//	stream                     opens a stream for "default" and answers with its first certificate
//	conns <n>                  opens n connections kept open, one Fetch on each: "served <k> refused <code> <message>"
//	next                       the stream's next answer, or how it ended: "error <code> <message>"
//	close                      closes the stream: "closed"
//	handoff                    connects, sends the connected socket over fd 3, answers "sent"
//	svid                       one Workload API FetchX509SVID: "svid <base64 DER chain> <base64 PKCS#8 key>"
//	forkflood <w> <ms> <s>     w workers fork, for s seconds, children that take fresh uids, connect
//	                           a socket and exit, each connection kept ms (see forkFlood)
//	threadflood <n> <s>        n threads connect, send a preface, wait 200 ms, again, for s seconds
//	flood <n>                  opens n connections at once, 64 at a time, each sending a client's
//	                           preface and SETTINGS; keeps those the agent keeps: "flood closed <k> open <m>"
const childEnv = "NODEMODE_TEST_CALLER"

func runChild(sock string) int {
	in := bufio.NewScanner(os.Stdin)
	var (
		client *sdsclient.Client
		stream *sdsclient.Stream
		held   []*sdsclient.Client // conns: kept open until the caller exits
	)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "fetch":
			secs, _ := strconv.Atoi(f[1])
			fmt.Println(fetchOnce(sock, time.Duration(secs)*time.Second, f[2:]))
		case "stream":
			ctx := context.Background()
			var err error
			if client, err = sdsclient.Dial(ctx, sock); err != nil {
				fmt.Println("error dial", err)
				continue
			}
			if stream, err = client.Stream(ctx, sdsclient.StreamConfig{Names: []string{"default"}}); err != nil {
				fmt.Println("error", status.Code(err), err)
				continue
			}
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			r, err := stream.Next(tctx)
			cancel()
			if err != nil {
				fmt.Println("error", status.Code(err), err)
				continue
			}
			fmt.Println(describe(r, []string{"default"}))
		case "conns":
			n, _ := strconv.Atoi(f[1])
			served, refusal := 0, ""
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := sdsclient.Dial(ctx, sock)
				if err == nil {
					held = append(held, c)
					_, err = c.Fetch(ctx, "default")
				}
				cancel()
				if err == nil {
					served++
				} else if refusal == "" {
					refusal = fmt.Sprintf("%s %s", status.Code(err), strings.ReplaceAll(err.Error(), "\n", " "))
				}
			}
			fmt.Println("served", served, "refused", refusal)
		case "next":
			if stream == nil {
				fmt.Println("error no-stream")
				continue
			}
			tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			r, err := stream.Next(tctx)
			cancel()
			if err != nil {
				fmt.Println("error", status.Code(err), strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Println(describe(r, []string{"default"}))
		case "close":
			if stream != nil {
				stream.Close()
			}
			if client != nil {
				_ = client.Close()
			}
			fmt.Println("closed")
		case "svid":
			fmt.Println(fetchSVID(sock))
		case "flood":
			n, _ := strconv.Atoi(f[1])
			closed, open := flood(sock, n)
			fmt.Println("flood closed", closed, "open", open)
		case "handoff":
			c, err := net.Dial("unix", sock)
			if err != nil {
				fmt.Println("error dial", err)
				continue
			}
			file, err := c.(*net.UnixConn).File()
			if err != nil {
				fmt.Println("error file", err)
				continue
			}
			if err := syscall.Sendmsg(3, []byte{0}, syscall.UnixRights(int(file.Fd())), nil, 0); err != nil {
				fmt.Println("error send", err)
				continue
			}
			fmt.Println("sent")
		case "forkflood": // forkflood <workers> <hold ms> <seconds>
			workers, _ := strconv.Atoi(f[1])
			hold, _ := strconv.Atoi(f[2])
			secs, _ := strconv.Atoi(f[3])
			fmt.Println(forkFlood(sock, workers, time.Duration(hold)*time.Millisecond, time.Duration(secs)*time.Second))
		case "threadflood": // threadflood <threads> <seconds>
			threads, _ := strconv.Atoi(f[1])
			secs, _ := strconv.Atoi(f[2])
			fmt.Println(threadFlood(sock, threads, time.Duration(secs)*time.Second))
		default:
			fmt.Println("error unknown command", f[0])
		}
	}
	return 0
}

func fetchOnce(sock string, timeout time.Duration, names []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := sdsclient.Dial(ctx, sock)
	if err != nil {
		return "error dial " + err.Error()
	}
	defer c.Close()
	r, err := c.Fetch(ctx, names...)
	if err != nil {
		return fmt.Sprintf("error %s %s", status.Code(err), strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return describe(r, names)
}

// describe is "ok" and the URI SAN of each certificate named (or "-" for a
// name answered without one).
func describe(r *sdsclient.Response, names []string) string {
	out := []string{"ok"}
	for _, name := range names {
		chain, _, ok := r.Cert(name)
		if !ok {
			out = append(out, "-")
			continue
		}
		block, _ := pem.Decode(chain)
		if block == nil {
			return "error bad-pem"
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil || len(cert.URIs) != 1 {
			return fmt.Sprintf("error bad-certificate %v", err)
		}
		out = append(out, cert.URIs[0].String())
	}
	return strings.Join(out, " ")
}

// caller is a child process talking to the agent's socket.
type caller struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	fd3   *os.File // our end of the child's fd 3, for handoff
}

// callerOpts says where a caller runs.
type callerOpts struct {
	podUID string              // the pod whose cgroup it is moved into; "" for none
	shape  podproc.Shape       // the cgroup path's shape
	cred   *syscall.Credential // run as this uid and gid; nil for the test's own
}

const containerID = "5e1f0c2b7a9d4e3f8c6b5a4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f"

// startCaller starts a caller of sock; it is moved into its pod's cgroup
// before it sends anything. The test's cleanup kills it.
func startCaller(t *testing.T, sock string, o callerOpts) *caller {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if o.cred != nil {
		bin = childBinary(t)
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "ours"), os.NewFile(uintptr(pair[1]), "theirs")
	c := &caller{t: t, fd3: ours}
	c.cmd = exec.Command(bin, "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+sock)
	c.cmd.ExtraFiles = []*os.File{theirs}
	if o.cred != nil {
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: o.cred}
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.out = bufio.NewScanner(stdout)
	c.cmd.Stderr = os.Stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	if o.podUID != "" {
		moved := false
		defer func() {
			if !moved { // Move failed the test
				podproc.Kill(c.cmd)
			}
		}()
		podproc.Move(t, c.cmd.Process.Pid, o.shape, o.podUID, containerID)
		moved = true
	}
	// Registered after Move's: the process dies before its cgroup is removed.
	t.Cleanup(func() { ours.Close(); podproc.Kill(c.cmd) })
	return c
}

// do sends one command and returns the answer line.
func (c *caller) do(cmd string) string {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("caller %d: %s: %v", c.cmd.Process.Pid, cmd, err)
	}
	if !c.out.Scan() {
		c.t.Fatalf("caller %d: %s: no answer (%v)", c.cmd.Process.Pid, cmd, c.out.Err())
	}
	return c.out.Text()
}

// fetch is one Fetch of names (default "default") on a new connection.
func (c *caller) fetch(names ...string) string {
	c.t.Helper()
	if len(names) == 0 {
		names = []string{"default"}
	}
	return c.do("fetch 30 " + strings.Join(names, " "))
}

// exit ends the caller and waits for it.
func (c *caller) exit() {
	c.t.Helper()
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		c.t.Fatalf("caller %d: %v", c.cmd.Process.Pid, err)
	}
}

// receiveConn receives the connection a handoff sent.
func (c *caller) receiveConn() net.Conn {
	c.t.Helper()
	oob := make([]byte, syscall.CmsgSpace(4))
	_, oobn, _, _, err := syscall.Recvmsg(int(c.fd3.Fd()), make([]byte, 1), oob, 0)
	if err != nil {
		c.t.Fatalf("receiving the connection: %v", err)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		c.t.Fatalf("control messages %v, %v", msgs, err)
	}
	fds, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		c.t.Fatalf("rights %v, %v", fds, err)
	}
	f := os.NewFile(uintptr(fds[0]), "handed-off")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		c.t.Fatal(err)
	}
	return nc
}

var (
	childBinOnce sync.Once
	childBinDir  string
	childBinErr  error
)

// childBinary is a copy of the test binary that processes of other uids
// can run (the build directory is private to root).
func childBinary(t *testing.T) string {
	t.Helper()
	heavy.Skip(t, "runs a copy of the test binary as another user")
	childBinOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			childBinErr = err
			return
		}
		if childBinDir, childBinErr = os.MkdirTemp("", "nodemode-bin"); childBinErr != nil {
			return
		}
		if childBinErr = os.Chmod(childBinDir, 0o755); childBinErr != nil {
			return
		}
		childBinErr = copyFile(self, filepath.Join(childBinDir, "caller"))
	})
	if childBinErr != nil {
		t.Fatalf("copying the test binary: %v", childBinErr)
	}
	return filepath.Join(childBinDir, "caller")
}

func removeChildBinary() {
	if childBinDir != "" {
		_ = os.RemoveAll(childBinDir)
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// flood opens n connections to sock as fast as it can (64 dialling at
// once, none waiting for an answer before the next is opened), each sending
// an HTTP/2 client's preface and an empty SETTINGS frame, then waits up to
// 10 s for the agent to close each; it returns how many it closed and how
// many it kept (left open until the process exits).
func flood(sock string, n int) (closed, open int) {
	var (
		mu      sync.Mutex
		dialers sync.WaitGroup
		readers sync.WaitGroup
		sem     = make(chan struct{}, 64)
		kept    []net.Conn
	)
	hello := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
	count := func(c net.Conn, err error) {
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			open++
			kept = append(kept, c)
			return
		}
		closed++
		if c != nil {
			_ = c.Close()
		}
	}
	for range n {
		sem <- struct{}{}
		dialers.Go(func() {
			c, err := net.Dial("unix", sock)
			<-sem
			if err != nil {
				count(nil, err)
				return
			}
			_, _ = c.Write(hello)
			readers.Go(func() {
				// Long enough for the agent to reach every connection of
				// the flood on a busy machine.
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						count(c, err)
						return
					}
				}
			})
		})
	}
	dialers.Wait()
	readers.Wait()
	floodKept = append(floodKept, kept...)
	return closed, open
}

// floodKept holds the connections a flood kept open.
var floodKept []net.Conn
