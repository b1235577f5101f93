package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
)

// idleConns opens -node-idle-conns connections to the agent from the pods'
// processes (spread over the pods, within the per-pod connection limit),
// each taken through the HTTP/2 handshake and then left without an RPC, as
// a pod's process that connects and waits would; it reports the agent's
// RSS and open files per connection, then closes them.
func (s *scaleRun) idleConns(ctx context.Context, pods []corev1.Pod, rep *Reporter, name func(string) string) error {
	opts := s.nb.b.opts
	k := opts.nodeIdleConns
	if k <= 0 || len(pods) == 0 {
		return nil
	}
	pid := s.agent.Pid()
	rssBefore, err := rssKB(pid)
	if err != nil {
		return err
	}
	fdsBefore, err := openFiles(pid)
	if err != nil {
		return err
	}
	conns := make([]*grpc.ClientConn, k)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	err = parallel(ctx, k, 8, func(i int) error {
		p, err := startPodClient(s.nb.podclient, s.agent.SDSSocket(), string(pods[i%len(pods)].UID))
		if err != nil {
			return err
		}
		// The process ends; its connection lives on here. Its cgroup is the
		// pod's container's, removed with the pod's streaming process.
		defer p.release()
		conns[i], err = p.connectIdle(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("idle connections: %w", err)
	}
	if err := sleepCtx(ctx, opts.settle); err != nil {
		return err
	}
	rssAfter, err := rssKB(pid)
	if err != nil {
		return err
	}
	fdsAfter, err := openFiles(pid)
	if err != nil {
		return err
	}
	target, fdTarget := "", ""
	if s.n == 1000 {
		target, fdTarget = "<= 12", "<= 1"
	}
	perConn := float64(rssAfter-rssBefore) / float64(k)
	rep.Report(Figure{Name: name("idle_conn_rss_kb"), Unit: "KB", Samples: []float64{perConn}, Target: target})
	rep.Report(Figure{Name: name("idle_conn_fds"), Unit: "fds", Samples: []float64{float64(fdsAfter-fdsBefore) / float64(k)}, Target: fdTarget})
	s.nb.b.log("node mode: %d idle connections: RSS %d -> %d kB, open files %d -> %d", k, rssBefore, rssAfter, fdsBefore, fdsAfter)
	return nil
}

// connectIdle lets the process connect and returns a gRPC connection over
// what it sent, ready (the agent accepted it and the HTTP/2 handshake is
// done) and without any RPC.
func (p *podClient) connectIdle(ctx context.Context) (*grpc.ClientConn, error) {
	if _, err := p.ctl.Write([]byte{'g'}); err != nil {
		return nil, fmt.Errorf("telling podclient to connect: %w", err)
	}
	nc, err := receiveConn(p.ctl)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	dial := func(context.Context, string) (net.Conn, error) {
		var c net.Conn
		once.Do(func() { c = nc })
		if c == nil {
			return nil, errors.New("the pod's connection is gone")
		}
		return c, nil
	}
	conn, err := grpc.NewClient("passthrough:///idle-"+p.uid,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			conn.Close()
			return nil, fmt.Errorf("idle connection of pod %s not ready (%v): %w", p.uid, s, ctx.Err())
		}
	}
	return conn, nil
}

// openFiles counts pid's open file descriptors.
func openFiles(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}
