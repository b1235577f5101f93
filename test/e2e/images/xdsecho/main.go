// Command xdsecho is a proxyless gRPC workload for Istio, the shape Istio calls
// "proxyless gRPC": grpc-go's own xDS client reads the bootstrap the agent beside it
// writes (GRPC_XDS_BOOTSTRAP, read by grpc-go itself: the agent's xDS proxy as the
// server, certificate_providers file_watcher over OUTPUT_CERTS,
// server_listener_resource_name_template) and takes its listeners, routes, clusters,
// endpoints, mTLS and RBAC from the control plane. No Envoy.
//
//	xdsecho server   serves grpc.testing.TestService on HOST:PORT (default 0.0.0.0:7070)
//	                 with an xDS-enabled gRPC server and xDS server credentials
//	                 (plaintext when the control plane sends no TLS). UnaryCall answers
//	                 with the caller's SPIFFE ID (username: the URI SAN of the client's
//	                 certificate, "" over plaintext), its own (server_id: the URI SAN
//	                 of the certificate its provider serves) and its host name. It
//	                 prints a line of kind "serving" whenever grpc-go's serving mode
//	                 changes.
//	xdsecho client   calls UnaryCall on TARGET (e.g. xds:///echo.ns.svc.cluster.local:7070)
//	                 every INTERVAL (default 100ms; CALL_TIMEOUT, default 1s, bounds a
//	                 call) and prints one line of kind "call" per call: whether it
//	                 succeeded, the gRPC code and error, the server's SPIFFE ID as the
//	                 client saw it on the TLS connection and as the server reported it,
//	                 the serial and issuer key of the server's certificate, the client
//	                 ID the server saw, and running counts of calls and
//	                 failures (all, and since the first success).
//
// Lines are JSON on stdout; the end-to-end tests read them from the pod's log. SIGTERM
// or SIGINT stops either side.
package main

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
)

// Line is one line of output.
type Line struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // "serving", "call", "exit"
	// serving
	Addr string `json:"addr,omitempty"`
	Mode string `json:"mode,omitempty"`
	Self string `json:"self,omitempty"`
	// call
	OK   bool   `json:"ok"`
	Code string `json:"code,omitempty"`
	// ServerID is the URI SAN of the certificate the server presented on the connection
	// ("" over plaintext); ServerSays is the identity the server reported; ClientID is the
	// caller identity the server saw.
	ServerID string `json:"server_id,omitempty"`
	// ServerSerial and ServerIssuer are the serial (hex) and authority key ID (hex) of the
	// server's certificate on the connection: a new certificate or a new issuing key (a
	// root rotation) shows here.
	ServerSerial    string `json:"server_serial,omitempty"`
	ServerIssuer    string `json:"server_issuer,omitempty"`
	ServerSays      string `json:"server_says,omitempty"`
	ClientID        string `json:"client_id,omitempty"`
	Calls           int    `json:"calls,omitempty"`
	Failures        int    `json:"failures"`
	FailuresAfterOK int    `json:"failures_after_ok"`
	Error           string `json:"error,omitempty"`
}

var outMu sync.Mutex

func emit(l Line) {
	l.Time = time.Now().UTC()
	b, _ := json.Marshal(l)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, "%s\n", b)
}

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: xdsecho server|client (settings from the environment)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	if os.Args[1] == "server" {
		err = server(ctx)
	} else {
		err = client(ctx)
	}
	if err != nil {
		emit(Line{Kind: "exit", Error: err.Error()})
		os.Exit(1)
	}
	emit(Line{Kind: "exit"})
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envDuration(name, def string) (time.Duration, error) {
	d, err := time.ParseDuration(envOr(name, def))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as %s", name, os.Getenv(name), def)
	}
	return d, nil
}

// uriSAN is the first URI SAN of a certificate, "" when there is none.
func uriSAN(c *x509.Certificate) string {
	if c == nil || len(c.URIs) == 0 {
		return ""
	}
	return c.URIs[0].String()
}

// peerCert is the peer's leaf certificate on the call's connection, nil over plaintext.
func peerCert(p *peer.Peer) *x509.Certificate {
	if p == nil {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil
	}
	return info.State.PeerCertificates[0]
}

// peerID is the URI SAN of the peer's certificate on the call's connection.
func peerID(p *peer.Peer) string { return uriSAN(peerCert(p)) }

// ownCertFile is the certificate file of the bootstrap's certificate provider instance
// "default" (the one Istio's and the agent's bootstraps name), "" when there is none.
func ownCertFile() string {
	path := os.Getenv("GRPC_XDS_BOOTSTRAP")
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var bs struct {
		CertificateProviders map[string]struct {
			Config struct {
				CertificateFile string `json:"certificate_file"`
			} `json:"config"`
		} `json:"certificate_providers"`
	}
	if json.Unmarshal(b, &bs) != nil {
		return ""
	}
	return bs.CertificateProviders["default"].Config.CertificateFile
}

// selfID reads the leaf the certificate provider serves (read again on each call, so a
// rotated certificate shows at once).
func selfID(file string) string {
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return ""
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return ""
	}
	return uriSAN(c)
}

type echo struct {
	testgrpc.UnimplementedTestServiceServer
	certFile string
	hostname string
}

func (e *echo) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	p, _ := peer.FromContext(ctx)
	return &testgrpc.SimpleResponse{Username: peerID(p), ServerId: selfID(e.certFile), Hostname: e.hostname}, nil
}

func (e *echo) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func server(ctx context.Context) error {
	addr := net.JoinHostPort(envOr("HOST", "0.0.0.0"), envOr("PORT", "7070"))
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return err
	}
	e := &echo{certFile: ownCertFile()}
	e.hostname, _ = os.Hostname()
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.ServingModeCallback(func(a net.Addr, args xds.ServingModeChangeArgs) {
		l := Line{Kind: "serving", Addr: a.String(), Mode: args.Mode.String(), Self: selfID(e.certFile)}
		if args.Err != nil {
			l.Error = args.Err.Error()
		}
		emit(l)
	}))
	if err != nil {
		return fmt.Errorf("xDS server (GRPC_XDS_BOOTSTRAP=%q): %w", os.Getenv("GRPC_XDS_BOOTSTRAP"), err)
	}
	testgrpc.RegisterTestServiceServer(srv, e)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		srv.GracefulStop()
		<-served
		return nil
	}
}

func client(ctx context.Context) error {
	target := os.Getenv("TARGET")
	if target == "" {
		return errors.New("TARGET is required (e.g. xds:///echo.default.svc.cluster.local:7070)")
	}
	interval, err := envDuration("INTERVAL", "100ms")
	if err != nil {
		return err
	}
	timeout, err := envDuration("CALL_TIMEOUT", "1s")
	if err != nil {
		return err
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("client for %s: %w", target, err)
	}
	defer cc.Close()
	cc.Connect()
	tc := testgrpc.NewTestServiceClient(cc)
	t := time.NewTicker(interval)
	defer t.Stop()
	var calls, failures, failuresAfterOK int
	okOnce := false
	for {
		calls++
		l := call(ctx, tc, timeout)
		if l.OK {
			okOnce = true
		} else {
			failures++
			if okOnce {
				failuresAfterOK++
			}
		}
		l.Calls, l.Failures, l.FailuresAfterOK = calls, failures, failuresAfterOK
		emit(l)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func call(ctx context.Context, tc testgrpc.TestServiceClient, timeout time.Duration) Line {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var p peer.Peer
	resp, err := tc.UnaryCall(ctx, &testgrpc.SimpleRequest{FillUsername: true, FillServerId: true}, grpc.Peer(&p))
	l := Line{Kind: "call", OK: err == nil, Code: status.Code(err).String(), ServerID: peerID(&p)}
	if c := peerCert(&p); c != nil {
		l.ServerSerial, l.ServerIssuer = c.SerialNumber.Text(16), hex.EncodeToString(c.AuthorityKeyId)
	}
	if err != nil {
		l.Error = err.Error()
		return l
	}
	l.ServerSays, l.ClientID = resp.GetServerId(), resp.GetUsername()
	return l
}
