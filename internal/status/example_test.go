package status_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/meshagent/meshagent/internal/status"
)

func ExampleServer() {
	listening := make(chan net.Addr, 1)
	s := status.New(status.Config{Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { listening <- a }})
	var certErr = errors.New("no workload certificate yet")
	s.AddReadiness("workload_certificate", func() error { return certErr })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	base := "http://" + (<-listening).String()

	resp, err := http.Get(base + "/healthz/ready")
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("%d %s", resp.StatusCode, body)

	cancel()
	fmt.Println(<-done)
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 503 not ready
	// workload_certificate: no workload certificate yet
	// <nil>
}
