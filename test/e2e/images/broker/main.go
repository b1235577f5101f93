// Command broker is the end-to-end tests' SPIFFE Broker API client and its
// peer, one image in two modes (MODE):
//
//   - broker: gets its own X.509-SVID from the Workload API
//     (SPIFFE_ENDPOINT_SOCKET, the node agent's socket through the CSI
//     volume), connects to the Broker API (SPIFFE_BROKER_SOCKET) over mutual
//     TLS, accepting only the agent's SPIFFE ID (AGENT_ID), subscribes to the
//     X.509-SVID of the pod TARGET (<namespace>/<name>), and every INTERVAL
//     dials PEER with mutual TLS presenting that workload's SVID.
//   - peer: gets its own X.509-SVID from the Workload API and serves mutual
//     TLS on LISTEN to any client with an X.509-SVID of its trust domain.
//
// Every INTERVAL it prints one JSON line (Report); the tests read them from
// the pod's log.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
)

// Report is one line of output.
type Report struct {
	Time time.Time `json:"time"`
	Mode string    `json:"mode"`
	// Self is the SPIFFE ID of the process's own SVID (Workload API).
	Self    string `json:"self,omitempty"`
	SelfErr string `json:"self_err,omitempty"`
	// Workload is the SPIFFE ID of the SVID the broker holds for TARGET.
	Workload    string `json:"workload,omitempty"`
	WorkloadErr string `json:"workload_err,omitempty"`
	// Peer is the server's identity of the last handshake as the workload.
	Peer    string `json:"peer,omitempty"`
	PeerErr string `json:"peer_err,omitempty"`
	// Accepted are the client identities the peer accepted since the last report.
	Accepted []string `json:"accepted,omitempty"`
}

type state struct {
	mu sync.Mutex
	r  Report
}

func (s *state) set(f func(*Report)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.r)
}

func (s *state) print() {
	s.mu.Lock()
	r := s.r
	r.Time = time.Now()
	s.r.Accepted = nil
	s.mu.Unlock()
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func main() {
	interval, err := time.ParseDuration(os.Getenv("INTERVAL"))
	if err != nil {
		interval = time.Second
	}
	ctx := context.Background()
	st := &state{r: Report{Mode: os.Getenv("MODE")}}
	source, err := workloadapi.NewX509Source(ctx)
	if err != nil {
		st.set(func(r *Report) { r.SelfErr = err.Error() })
		st.print()
		os.Exit(1)
	}
	defer source.Close()
	if svid, err := source.GetX509SVID(); err == nil {
		st.set(func(r *Report) { r.Self = svid.ID.String() })
	}
	switch os.Getenv("MODE") {
	case "peer":
		go peer(source, os.Getenv("LISTEN"), st)
	default:
		go broker(ctx, source, st, interval)
	}
	for range time.Tick(interval) {
		st.print()
	}
}

// peer serves mutual TLS to any X.509-SVID of its trust domain.
func peer(source *workloadapi.X509Source, listen string, st *state) {
	svid, err := source.GetX509SVID()
	if err != nil {
		st.set(func(r *Report) { r.SelfErr = err.Error() })
		return
	}
	tc := tlsconfig.MTLSServerConfig(source, source, tlsconfig.AuthorizeMemberOf(svid.ID.TrustDomain()))
	l, err := tls.Listen("tcp", listen, tc)
	if err != nil {
		st.set(func(r *Report) { r.SelfErr = err.Error() })
		return
	}
	for {
		c, err := l.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer c.Close()
			tc := c.(*tls.Conn)
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err != nil {
				return
			}
			if id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0]); err == nil {
				st.set(func(r *Report) { r.Accepted = append(r.Accepted, id.String()) })
			}
			_, _ = c.Write([]byte("ok\n"))
		}()
	}
}

// broker follows TARGET's SVID on the Broker API and dials PEER with it.
func broker(ctx context.Context, source *workloadapi.X509Source, st *state, interval time.Duration) {
	agent, err := spiffeid.FromString(os.Getenv("AGENT_ID"))
	if err != nil {
		st.set(func(r *Report) { r.WorkloadErr = "AGENT_ID: " + err.Error() })
		return
	}
	addr := strings.TrimPrefix(os.Getenv("SPIFFE_BROKER_SOCKET"), "unix://")
	conn, err := grpc.NewClient("unix://"+addr, grpc.WithTransportCredentials(credentials.NewTLS(
		tlsconfig.MTLSClientConfig(source, source, tlsconfig.AuthorizeID(agent)))))
	if err != nil {
		st.set(func(r *Report) { r.WorkloadErr = err.Error() })
		return
	}
	ns, name, _ := strings.Cut(os.Getenv("TARGET"), "/")
	ref, _ := anypb.New(&brokerpb.KubernetesObjectReference{
		Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"},
		Key:  &brokerpb.KubernetesObjectKey{Namespace: ns, Name: name},
	})
	var (
		mu     sync.Mutex
		svid   *x509svid.SVID
		bundle *x509bundle.Bundle
	)
	go func() {
		for {
			sctx := metadata.AppendToOutgoingContext(ctx, "broker.spiffe.io", "true")
			stream, err := brokerpb.NewAPIClient(conn).SubscribeToX509SVID(sctx,
				&brokerpb.SubscribeToX509SVIDRequest{Reference: &brokerpb.WorkloadReference{Reference: ref}})
			for err == nil {
				var resp *brokerpb.SubscribeToX509SVIDResponse
				if resp, err = stream.Recv(); err != nil || len(resp.GetSvids()) == 0 {
					break
				}
				s := resp.GetSvids()[0]
				sv, perr := x509svid.ParseRaw(s.GetX509Svid(), s.GetX509SvidKey())
				if perr != nil {
					err = perr
					break
				}
				b, perr := x509bundle.ParseRaw(sv.ID.TrustDomain(), s.GetBundle())
				if perr != nil {
					err = perr
					break
				}
				mu.Lock()
				svid, bundle = sv, b
				mu.Unlock()
				st.set(func(r *Report) { r.Workload, r.WorkloadErr = sv.ID.String(), "" })
			}
			if err != nil {
				st.set(func(r *Report) { r.WorkloadErr = err.Error() })
			}
			time.Sleep(interval)
		}
	}()
	for range time.Tick(interval) {
		mu.Lock()
		sv, b := svid, bundle
		mu.Unlock()
		if sv == nil {
			continue
		}
		tc := tlsconfig.MTLSClientConfig(sv, b, tlsconfig.AuthorizeMemberOf(sv.ID.TrustDomain()))
		d := &net.Dialer{Timeout: 5 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", os.Getenv("PEER"), tc)
		if err != nil {
			st.set(func(r *Report) { r.PeerErr = err.Error() })
			continue
		}
		id, err := x509svid.IDFromCert(c.ConnectionState().PeerCertificates[0])
		_ = c.Close()
		if err != nil {
			st.set(func(r *Report) { r.PeerErr = err.Error() })
			continue
		}
		st.set(func(r *Report) { r.Peer, r.PeerErr = id.String(), "" })
	}
}
