package main

import (
	"bytes"
	"io"
	"sync"
)

// heldWriter keeps what is written to it until release, then writes it to
// dst, and passes everything after straight through. The agent's log goes
// through one while app.New checks the configuration: a configuration error
// is then the first line on stderr, before the start-up log lines that led
// to it.
type heldWriter struct {
	mu       sync.Mutex
	dst      io.Writer
	buf      bytes.Buffer
	released bool
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released {
		return w.dst.Write(p)
	}
	return w.buf.Write(p)
}

// release writes what was held and lets later writes through. It is safe to
// call twice.
func (w *heldWriter) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released {
		return
	}
	w.released = true
	_, _ = w.dst.Write(w.buf.Bytes())
	w.buf = bytes.Buffer{}
}
