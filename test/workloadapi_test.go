package test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	gsworkloadapi "github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/test/agentproc"
	"github.com/meshagent/meshagent/test/istioca"
	"github.com/meshagent/meshagent/test/sdsclient"
)

// wlSVID is the SPIFFE ID the test CA issues to the VM agent's workload.
var wlSVID = spiffeid.RequireFromString("spiffe://cluster.local/ns/" + vmSA.Namespace + "/sa/" + vmSA.Name)

// wlAgent starts the agent binary in CA mode against a test CA, with
// certificates living ttl, and returns it with the CA.
func wlAgent(t *testing.T, ttl string, extra ...string) (*agentproc.Proc, *istioca.Server) {
	t.Helper()
	ca := istioca.Start(t, istioca.Config{Tokens: map[string]istioca.ServiceAccount{vmToken: vmSA}})
	dir := agentproc.TempDir(t)
	vmWriteToken(t, dir)
	rootPath := dir + "/root-cert.pem"
	flWrite(t, rootPath, ca.RootPEM())
	return agentproc.Start(t, dir, vmEnv(ca, dir, append([]string{"CA_ROOT_CA=" + rootPath, "SECRET_TTL=" + ttl}, extra...)...)...), ca
}

// wlSource opens go-spiffe's X509Source on the agent's socket; it retries
// until the agent serves.
func wlSource(t *testing.T, p *agentproc.Proc) *gsworkloadapi.X509Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := gsworkloadapi.NewX509Source(ctx, gsworkloadapi.WithClientOptions(gsworkloadapi.WithAddr("unix://"+p.Socket())))
	if err != nil {
		t.Fatalf("go-spiffe X509Source: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// wlHandshake makes an mTLS connection between a server configured from
// one source and a client from another, each authorizing the other's ID,
// and echoes a message over it.
func wlHandshake(t *testing.T, server, client *gsworkloadapi.X509Source) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(server, server, tlsconfig.AuthorizeID(wlSVID)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	served := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			served <- err
			return
		}
		defer func() { _ = c.Close() }()
		_, err = io.Copy(c, io.LimitReader(c, 4))
		served <- err
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), tlsconfig.MTLSClientConfig(client, client, tlsconfig.AuthorizeID(wlSVID)))
	if err != nil {
		t.Fatalf("mTLS handshake: %v", err)
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo over mTLS: %q, %v", buf, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("server side of the mTLS connection: %v", err)
	}
}

// go-spiffe, pointed at the agent binary's socket, gets the SVID the test CA
// issued; two sources make an mTLS connection that both sides verify; the
// SVID rotates on the open stream, without a new connection; and a call
// without the security header is refused with InvalidArgument.
func TestWorkloadAPIGoSpiffe(t *testing.T) {
	p, ca := wlAgent(t, "4s")
	server, client := wlSource(t, p), wlSource(t, p)

	svid, err := client.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != wlSVID {
		t.Fatalf("SVID %s, want %s", svid.ID, wlSVID)
	}
	if _, err := svid.Certificates[0].Verify(x509.VerifyOptions{
		Roots: ca.Roots(), Intermediates: pki.CertPool(svid.Certificates[1:]), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		t.Fatalf("the SVID does not verify to the test CA's root: %v", err)
	}
	wlHandshake(t, server, client)

	connections := strings.Count(p.Logs(), "local client connected")
	seen := map[string]bool{svid.Certificates[0].SerialNumber.String(): true}
	updated := client.Updated()
	for len(seen) < 3 {
		select {
		case <-updated:
		case <-time.After(15 * time.Second):
			t.Fatalf("no rotation reached the X509Source within 15 s (%d certificates seen)", len(seen))
		}
		svid, err := client.GetX509SVID()
		if err != nil {
			t.Fatal(err)
		}
		seen[svid.Certificates[0].SerialNumber.String()] = true
	}
	if now := strings.Count(p.Logs(), "local client connected"); now != connections {
		t.Fatalf("the sources made %d new connections during the rotations, want none", now-connections)
	}
	wlHandshake(t, server, client) // with the rotated certificates

	conn, err := grpc.NewClient("unix://"+p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := workload.NewSpiffeWorkloadAPIClient(conn).FetchX509SVID(ctx, &workload.X509SVIDRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "security header missing") {
		t.Fatalf("a call without the security header: %v, want InvalidArgument", err)
	}
}

// MESHAGENT_WORKLOAD_API=false leaves the service out: SDS is served alone.
func TestWorkloadAPITurnedOff(t *testing.T) {
	p, _ := wlAgent(t, "1h", "MESHAGENT_WORKLOAD_API=false")
	conn, err := grpc.NewClient("unix://"+p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Fetch(ctx, "default"); err != nil {
		t.Fatalf("SDS: %v", err)
	}
	_, err = workload.NewSpiffeWorkloadAPIClient(conn).FetchJWTSVID(metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"),
		&workload.JWTSVIDRequest{Audience: []string{"a"}})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "unknown service") {
		t.Fatalf("Workload API with MESHAGENT_WORKLOAD_API=false: %v, want the service unknown", err)
	}
}
