package udsserver

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
)

// readyReader is the method gRPC's transport looks for on a connection to
// read it without a buffer of its own per connection.
type readyReader interface {
	ReadOnReady(bufSize int, pool mem.BufferPool) (*[]byte, int, error)
}

var _ readyReader = (*localConn)(nil)

// TestLocalConnReadOnReady reads a real Unix socket through the server's
// connection as gRPC does: what the peer wrote, in reads of at most the
// size asked, then io.EOF when the peer closes; and an error, not a hang,
// once the connection itself is closed.
func TestLocalConnReadOnReady(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{SocketPath: path, Services: []func(*grpc.Server){registerWho}, MaxRecvBytes: 64 << 10, MaxConnsPerCaller: 32, MaxConnRatePerCaller: 20, MaxStreamsPerConn: 100, MaxUnaryPerCaller: 16, MaxQueuedBytesPerCaller: 4 << 20, IdleTimeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p := newLocalConn(server.(*net.UnixConn), newConn(), srv)
	defer p.Close()
	if p.rd.raw == nil {
		t.Fatal("the Unix connection has no raw connection to read when ready")
	}

	want := "0123456789abcdefghij"
	done := make(chan error, 1)
	go func() {
		_, err := client.Write([]byte(want))
		if err == nil {
			err = client.Close()
		}
		done <- err
	}()
	pool := mem.DefaultBufferPool()
	var got []byte
	for {
		buf, n, err := p.ReadOnReady(8, pool)
		if n > 8 {
			t.Fatalf("read %d bytes, asked for at most 8", n)
		}
		if n > 0 {
			got = append(got, (*buf)[:n]...)
			pool.Put(buf)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("ReadOnReady: %v", err)
		}
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	_ = p.Close()
	if buf, n, err := p.ReadOnReady(8, pool); err == nil || n != 0 || buf != nil {
		t.Fatalf("ReadOnReady on a closed connection = (%v, %d, %v), want an error", buf, n, err)
	}
}
