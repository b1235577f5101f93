package podproc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/test/sdsclient"
)

// fetchEnv and fetchNameEnv make the test binary a fetch child: the socket
// and the resource it fetches.
const (
	fetchEnv     = "PODPROC_SDS_FETCH"
	fetchNameEnv = "PODPROC_SDS_NAME"
)

// RunFetchChild turns the test binary into the child FetchAsPod starts, and
// never returns then; otherwise it returns at once. Call it first in the
// TestMain of a package that uses FetchAsPod.
func RunFetchChild() {
	if sock := os.Getenv(fetchEnv); sock != "" {
		os.Exit(fetchChild(sock, os.Getenv(fetchNameEnv)))
	}
}

// fetchChild waits for a line on stdin (the parent moves it into the pod's
// cgroup meanwhile), fetches name over SDS from sock and prints the leaf
// certificate of its chain in base64 DER, or "error: ..." on failure.
func fetchChild(sock, name string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 2
	}
	leaf, err := fetchLeaf(sock, name)
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	fmt.Println(base64.StdEncoding.EncodeToString(leaf))
	return 0
}

func fetchLeaf(sock, name string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdsclient.Dial(ctx, sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	resp, err := c.Fetch(ctx, name)
	if err != nil {
		return nil, err
	}
	chain, _, ok := resp.Cert(name)
	if !ok {
		return nil, errors.New("no certificate")
	}
	block, _ := pem.Decode(chain)
	if block == nil {
		return nil, errors.New("chain is not PEM")
	}
	return block.Bytes, nil
}

// FetchAsPod runs the test binary again, as a child in the cgroup of pod uid
// spelled as shape, that fetches the SDS resource name from the agent's
// socket sock. It returns the leaf certificate served, or the error the
// child met (a gRPC status, for a refusal).
func FetchAsPod(t testing.TB, sock, uid string, shape Shape, name string) (*x509.Certificate, error) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), fetchEnv+"="+sock, fetchNameEnv+"="+name)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	child.Stdout = &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer Kill(child) // if Move fails
	Move(t, child.Process.Pid, shape, uid, ContainerID(0))
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v; output %q", err, out.String())
	}
	line := strings.TrimSpace(out.String())
	if msg, ok := strings.CutPrefix(line, "error: "); ok {
		return nil, errors.New(msg)
	}
	der, err := base64.StdEncoding.DecodeString(line)
	if err != nil {
		t.Fatalf("child printed %q: %v", line, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("child's certificate: %v", err)
	}
	return cert, nil
}
