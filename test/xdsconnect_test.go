package test

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshagent/meshagent/internal/testwait"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/xdsserver"
)

// tcpFront forwards loopback TCP connections to addr and counts them.
type tcpFront struct {
	lis   net.Listener
	conns atomic.Int64
	wg    sync.WaitGroup
}

func startTCPFront(t *testing.T, addr string) *tcpFront {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &tcpFront{lis: lis}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			f.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer f.wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	// Runs after the agent has stopped (cleanups run last first), so its
	// connections have ended.
	t.Cleanup(func() {
		_ = lis.Close()
		f.wg.Wait()
	})
	return f
}

// The agent connects its xDS proxy to the control plane once it holds its
// first certificate, not while it waits for the CA (the handshakes would
// share the CPU on the way to that certificate), and then without any
// client asking.
func TestXDSUpstreamConnectsAfterTheFirstCertificate(t *testing.T) {
	ca := istioca.Start(t, istioca.Config{})
	ca.AddToken("token-xc", istioca.ServiceAccount{Namespace: "xc", Name: "xc"})
	xs := xdsserver.Start(t, xdsserver.Config{CA: ca.CA(), ServerNames: []string{istioca.DefaultServerName}, Tokens: []string{"token-xc"}})
	front := startTCPFront(t, xs.Addr())
	ca.Stop() // down while the agent starts

	dir := agentproc.TempDir(t)
	tokenPath := filepath.Join(dir, "token")
	rootPath := filepath.Join(dir, "root.pem")
	if err := os.WriteFile(tokenPath, []byte("token-xc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootPath, ca.RootPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	proxyConfig, _ := json.Marshal(map[string]any{"discoveryAddress": front.lis.Addr().String()})
	p := agentproc.Start(t, dir,
		"CA_ADDR="+ca.Addr(),
		"CA_ROOT_CA="+rootPath,
		"XDS_ROOT_CA="+rootPath,
		"ISTIOD_SAN="+istioca.DefaultServerName,
		"PROXY_CONFIG="+string(proxyConfig),
		"MESHAGENT_TOKEN_PATH="+tokenPath,
		"POD_NAMESPACE=xc", "SERVICE_ACCOUNT=xc",
		"STATUS_PORT=0", "MESHAGENT_STATUS_HOST=127.0.0.1",
		"MESHAGENT_LOG_LEVEL=debug",
	)
	xdsSocket := filepath.Join(dir, "etc/istio/proxy/XDS")
	testwait.Within(t, 15*time.Second, "the xDS proxy socket", func() bool {
		_, err := os.Stat(xdsSocket)
		return err == nil
	})
	// The proxy serves and the CA is down. Once the agent has failed to
	// reach the CA twice (the second attempt after a backoff), the proxy has
	// been running for a while: a wrongly eager connection would show.
	testwait.Within(t, 30*time.Second, "two failed certificate requests", func() bool {
		return strings.Count(p.Logs(), "certificate request failed") >= 2
	})
	if n := front.conns.Load(); n != 0 {
		t.Fatalf("%d connections to the control plane before the first certificate, want 0\n%s", n, p.Logs())
	}

	ca.Restart(t)
	testwait.Within(t, 30*time.Second, "the connection to the control plane after the first certificate", func() bool {
		return front.conns.Load() == 1
	})
}
