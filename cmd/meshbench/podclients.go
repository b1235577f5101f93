package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshagent/meshagent/test/podproc"
)

// podClient is one pod's process (the podclient program, in the pod's
// cgroup) and the SDS stream meshbench runs over the connection that process
// made: the agent sees the pod's pid on it.
type podClient struct {
	uid  string
	proc *exec.Cmd
	ctl  *os.File // meshbench's end of the process's fd 3
	conn *grpc.ClientConn
	dirs []string // cgroup directories made for it, innermost first

	mu     sync.Mutex
	keys   []uint64    // each certificate chain received, in order
	times  []time.Time // when each arrived
	err    error
	first  chan struct{} // closed at the first certificate or failure
	closed bool
}

// startPodClient starts the podclient program in a new cgroup of the pod
// with the given UID and returns once it is there, before it connects.
func startPodClient(bin, socket, podUID string) (*podClient, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "podclient-ctl"), os.NewFile(uintptr(fds[1]), "podclient-ctl")
	defer theirs.Close()
	cmd := exec.Command(bin, socket)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Env = []string{"GOMAXPROCS=1", "GOGC=off"}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &podClient{uid: podUID, proc: cmd, ctl: ours, first: make(chan struct{})}
	if err := p.move(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// move puts the process in container <hash of uid> of the pod, on every
// cgroup hierarchy the node has, as podproc does for tests.
func (p *podClient) move() error {
	roots, err := podproc.Roots()
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(p.uid))
	podRel, ctrRel := podproc.Dirs(podproc.Cgroupfs, p.uid, hex.EncodeToString(sum[:]))
	for _, root := range roots {
		podDir, ctrDir := filepath.Join(root, podRel), filepath.Join(root, ctrRel)
		if err := os.MkdirAll(ctrDir, 0o755); err != nil {
			return fmt.Errorf("creating pod cgroup (run as root): %w", err)
		}
		p.dirs = append(p.dirs, ctrDir, podDir)
		if err := os.WriteFile(filepath.Join(ctrDir, "cgroup.procs"), []byte(strconv.Itoa(p.proc.Process.Pid)), 0o644); err != nil {
			return fmt.Errorf("moving pid %d into %s: %w", p.proc.Process.Pid, ctrDir, err)
		}
	}
	return nil
}

// connect lets the process connect to the socket, takes the connection it
// sends and opens the SDS stream for "default" on it. It returns the time
// just before the process was told to connect.
func (p *podClient) connect(ctx context.Context) (time.Time, error) {
	start := time.Now()
	if _, err := p.ctl.Write([]byte{'g'}); err != nil {
		return start, fmt.Errorf("telling podclient to connect: %w", err)
	}
	nc, err := receiveConn(p.ctl)
	if err != nil {
		return start, err
	}
	once := false
	var mu sync.Mutex
	dial := func(context.Context, string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if once {
			return nil, errors.New("the pod's connection is gone")
		}
		once = true
		return nc, nil
	}
	p.conn, err = grpc.NewClient("passthrough:///pod-"+p.uid,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<20)))
	if err != nil {
		nc.Close()
		return start, err
	}
	stream, err := secretv3.NewSecretDiscoveryServiceClient(p.conn).StreamSecrets(ctx)
	if err != nil {
		return start, fmt.Errorf("opening SDS stream: %w", err)
	}
	go p.run(stream)
	return start, nil
}

// receiveConn reads one file descriptor sent with SCM_RIGHTS on ctl.
func receiveConn(ctl *os.File) (net.Conn, error) {
	buf, oob := make([]byte, 1), make([]byte, syscall.CmsgSpace(4))
	sc, err := ctl.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n, oobn int
	var rerr error
	if err := sc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), buf, oob, syscall.MSG_CMSG_CLOEXEC)
		return rerr != syscall.EAGAIN
	}); err != nil {
		return nil, err
	}
	if rerr != nil || n == 0 {
		return nil, fmt.Errorf("podclient sent no connection (it failed; see its message above): %v", rerr)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("podclient's message: %v", err)
	}
	fds, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("podclient's file descriptor: %v", err)
	}
	f := os.NewFile(uintptr(fds[0]), "pod-conn")
	defer f.Close()
	return net.FileConn(f)
}

// run receives and ACKs responses until the stream ends.
func (p *podClient) run(stream secretv3.SecretDiscoveryService_StreamSecretsClient) {
	if err := stream.Send(secretRequest([]string{defaultSecret}, nil)); err != nil {
		p.fail(fmt.Errorf("sending SDS request: %w", err))
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			p.fail(fmt.Errorf("receiving SDS response: %w", err))
			return
		}
		at := time.Now()
		key, err := certKey(resp, defaultSecret)
		if err != nil {
			p.fail(err)
			return
		}
		p.mu.Lock()
		if n := len(p.keys); n == 0 || p.keys[n-1] != key {
			p.keys = append(p.keys, key)
			p.times = append(p.times, at)
			if n == 0 {
				close(p.first)
			}
		}
		p.mu.Unlock()
		if err := stream.Send(secretRequest([]string{defaultSecret}, resp)); err != nil {
			p.fail(fmt.Errorf("sending SDS ACK: %w", err))
			return
		}
	}
}

func (p *podClient) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil && !p.closed {
		p.err = err
		if len(p.keys) == 0 {
			close(p.first)
		}
	}
}

// waitFirst waits for the first certificate and returns when it arrived.
func (p *podClient) waitFirst(ctx context.Context) (time.Time, error) {
	select {
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("pod %s: no certificate: %w", p.uid, ctx.Err())
	case <-p.first:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.keys) == 0 {
		return time.Time{}, fmt.Errorf("pod %s: %w", p.uid, p.err)
	}
	return p.times[0], nil
}

// state is the certificates received so far and the stream's failure.
func (p *podClient) state() ([]uint64, []time.Time, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uint64(nil), p.keys...), append([]time.Time(nil), p.times...), p.err
}

// release ends the process but keeps the connection and stream it made.
func (p *podClient) release() {
	if p.ctl != nil {
		p.ctl.Close()
		p.ctl = nil
		_ = p.proc.Wait()
	}
}

// Close ends the stream, the process and its cgroups.
func (p *podClient) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if p.conn != nil {
		p.conn.Close()
	}
	if p.ctl != nil {
		_ = p.proc.Process.Kill()
	}
	p.release()
	for _, d := range p.dirs {
		for range 100 {
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
