package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/secretmanager"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// Environment of a pod client: meshsoak started again as a process that
// the parent moves into a pod's cgroup before it writes a line on its stdin.
const (
	podModeEnv   = "MESHSOAK_POD_MODE"
	podSocketEnv = "MESHSOAK_POD_SOCKET"
	podCountEnv  = "MESHSOAK_POD_COUNT"
)

// runPodClient is the pod client's main: after the go-ahead line it acts
// as its mode says, printing one line per event, until its stdin closes.
//
//	fetch   a new connection and FetchSecrets "default" every 200 ms:
//	        "ok <ms> <uri>" or "err <ms> <code> <message>"
//	stream  one StreamSecrets "default": "cert <uri>" per response, then
//	        "ended <code> <message>" and "after ok|err <code>" for one more
//	        fetch on the same connection
//	flood   opens COUNT connections that send nothing: "held <n> <error>"
//	zero    one connection whose HTTP/2 window is 0 sends COUNT
//	        FetchSecrets and reads no answer: "sent <n> <error>"
func runPodClient(mode, socket string) int {
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = in.ReadString('\n') // EOF: the parent is done
		cancel()
	}()
	n, _ := strconv.Atoi(os.Getenv(podCountEnv))
	out := &lineWriter{}
	switch mode {
	case "fetch":
		for sleepCtx(ctx, 200*time.Millisecond) {
			start := time.Now()
			uri, err := fetchOnce(ctx, socket)
			ms := time.Since(start).Milliseconds()
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				out.printf("err %d %s %s", ms, status.Code(err), oneLine(err))
			} else {
				out.printf("ok %d %s", ms, uri)
			}
		}
	case "stream":
		streamUntilEnd(ctx, socket, out)
	case "flood":
		var conns []net.Conn
		var firstErr error
		for range n {
			c, err := net.Dial("unix", socket)
			if err != nil {
				firstErr = err
				break
			}
			conns = append(conns, c)
		}
		out.printf("held %d %v", len(conns), firstErr)
		<-ctx.Done()
		for _, c := range conns {
			_ = c.Close()
		}
	case "zero":
		c, sent, err := windowZeroFlood(socket, n)
		out.printf("sent %d %v", sent, err)
		<-ctx.Done()
		if c != nil {
			_ = c.Close()
		}
	default:
		out.printf("unknown mode %q", mode)
		return 2
	}
	return 0
}

// lineWriter prints whole lines to stdout from any goroutine.
type lineWriter struct{ mu sync.Mutex }

func (w *lineWriter) printf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf(format+"\n", args...)
}

func oneLine(err error) string {
	return string(bytes.ReplaceAll([]byte(err.Error()), []byte("\n"), []byte(" ")))
}

// fetchOnce connects and fetches "default", returning its leaf's URI.
func fetchOnce(ctx context.Context, socket string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, socket)
	if err != nil {
		return "", err
	}
	defer c.Close()
	r, err := c.Fetch(ctx, secretmanager.WorkloadCertName)
	if err != nil {
		return "", err
	}
	return leafURI(r)
}

func leafURI(r *sdsclient.Response) (string, error) {
	chain, _, ok := r.Cert(secretmanager.WorkloadCertName)
	if !ok {
		return "", fmt.Errorf("no %s in the answer", secretmanager.WorkloadCertName)
	}
	certs, err := pki.ParseCertificates(chain)
	if err != nil {
		return "", err
	}
	if len(certs[0].URIs) != 1 {
		return "", fmt.Errorf("leaf has %d URIs", len(certs[0].URIs))
	}
	return certs[0].URIs[0].String(), nil
}

func streamUntilEnd(ctx context.Context, socket string, out *lineWriter) {
	c, err := sdsclient.Dial(ctx, socket)
	if err != nil {
		out.printf("ended %s %s", status.Code(err), oneLine(err))
		return
	}
	defer c.Close()
	st, err := c.Stream(ctx, sdsclient.StreamConfig{Names: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		out.printf("ended %s %s", status.Code(err), oneLine(err))
		return
	}
	defer st.Close()
	for {
		r, err := st.Next(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			out.printf("ended %s %s", status.Code(err), oneLine(err))
			break
		}
		uri, err := leafURI(r)
		if err != nil {
			out.printf("cert invalid %s", oneLine(err))
			continue
		}
		out.printf("cert %s", uri)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Fetch(fctx, secretmanager.WorkloadCertName); err != nil {
		out.printf("after err %s", status.Code(err))
	} else {
		out.printf("after ok")
	}
	<-ctx.Done()
}

// settingsPerCall is how many empty SETTINGS frames windowZeroFlood sends
// after each call.
const settingsPerCall = 4

// windowZeroFlood speaks HTTP/2 itself: it sets its initial window to 0, so
// the agent may send no response data, and opens n FetchSecrets calls it
// never reads, each followed by settingsPerCall empty SETTINGS frames. It answers the agent's SETTINGS and PINGs so that the
// connection stays up. The connection is returned open.
func windowZeroFlood(socket string, n int) (net.Conn, int, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return nil, 0, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return c, 0, err
	}
	fr := http2.NewFramer(c, c)
	var wmu sync.Mutex
	write := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		return f()
	}
	if err := write(func() error {
		return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	}); err != nil {
		return c, 0, err
	}
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = write(fr.WriteSettingsAck)
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = write(func() error { return fr.WritePing(true, f.Data) })
				}
			}
		}
	}()
	req, err := proto.Marshal(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{secretmanager.WorkloadCertName}})
	if err != nil {
		return c, 0, err
	}
	msg := append([]byte{0, 0, 0, 0, 0}, req...)
	msg[1], msg[2], msg[3], msg[4] = byte(len(req)>>24), byte(len(req)>>16), byte(len(req)>>8), byte(len(req))
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "localhost"},
		{":path", "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
			return c, 0, err
		}
	}
	block := hb.Bytes()
	sent := 0
	for i := range n {
		id := uint32(2*i + 1)
		err := write(func() error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
				return err
			}
			if err := fr.WriteData(id, true, msg); err != nil {
				return err
			}
			// Empty SETTINGS frames make the agent write acknowledgements,
			// which must not count as responses the client has taken.
			for range settingsPerCall {
				if err := fr.WriteSettings(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return c, sent, err
		}
		sent++
	}
	return c, sent, nil
}
