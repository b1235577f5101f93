// Command client is the end-to-end tests' workload: every INTERVAL it fetches its
// X.509 SVID from the node agent's socket over the SPIFFE Workload API (go-spiffe) and
// over SDS (Envoy's protocol), tries to remove the socket, and prints one JSON line of
// what it got. The tests read these lines from the pod's log.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshagent/meshagent/test/sdsclient"
)

// Report is one line of the client's output.
type Report struct {
	Time           time.Time `json:"time"`
	WorkloadAPI    string    `json:"workload_api,omitempty"`
	WorkloadAPIErr string    `json:"workload_api_err,omitempty"`
	SDS            string    `json:"sds,omitempty"`
	SDSErr         string    `json:"sds_err,omitempty"`
	RemoveErr      string    `json:"remove_err"`
}

func main() {
	socket := os.Getenv("SOCKET")
	if socket == "" {
		socket = "/run/meshagent/socket"
	}
	interval, err := time.ParseDuration(os.Getenv("INTERVAL"))
	if err != nil {
		interval = 2 * time.Second
	}
	enc := json.NewEncoder(os.Stdout)
	for {
		enc.Encode(once(socket))
		time.Sleep(interval)
	}
}

func once(socket string) Report {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := Report{Time: time.Now().UTC()}
	if svid, err := workloadapi.FetchX509SVID(ctx, workloadapi.WithAddr("unix://"+socket)); err != nil {
		r.WorkloadAPIErr = err.Error()
	} else {
		r.WorkloadAPI = svid.ID.String()
	}
	if id, err := sdsID(ctx, socket); err != nil {
		r.SDSErr = err.Error()
	} else {
		r.SDS = id
	}
	// The volume is read-only: this must fail.
	if err := os.Remove(socket); err != nil {
		r.RemoveErr = err.Error()
	}
	return r
}

func sdsID(ctx context.Context, socket string) (string, error) {
	c, err := sdsclient.Dial(ctx, socket)
	if err != nil {
		return "", err
	}
	defer c.Close()
	resp, err := c.Fetch(ctx, "default")
	if err != nil {
		return "", err
	}
	chain, _, ok := resp.Cert("default")
	if !ok {
		return "", errors.New("no certificate named default")
	}
	block, _ := pem.Decode(chain)
	if block == nil {
		return "", errors.New("certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", err
	}
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("certificate has %d URI SANs", len(cert.URIs))
	}
	return cert.URIs[0].String(), nil
}
