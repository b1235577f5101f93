package main

import (
	"fmt"
	"sync"
	"testing"
)

// serverTB is the testing.TB the test servers are started with inside this
// program. Only what those servers call is implemented (Helper, Cleanup,
// Fatal, Fatalf, Logf, Name); anything else panics on the nil embedded TB.
// Fatal and Fatalf panic with a tbFailure that guard turns into an error.
type serverTB struct {
	testing.TB

	mu       sync.Mutex
	cleanups []func()
}

type tbFailure string

func (f tbFailure) Error() string { return string(f) }

func (t *serverTB) Helper()             {}
func (t *serverTB) Name() string        { return "meshsoak" }
func (t *serverTB) Logf(string, ...any) {}
func (t *serverTB) Fatal(args ...any)   { panic(tbFailure(fmt.Sprint(args...))) }
func (t *serverTB) Fatalf(format string, args ...any) {
	panic(tbFailure(fmt.Sprintf(format, args...)))
}

func (t *serverTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

// Close runs the cleanups, last registered first.
func (t *serverTB) Close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// guard runs f, returning a serverTB failure inside it as an error.
func guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			tf, ok := r.(tbFailure)
			if !ok {
				panic(r)
			}
			err = tf
		}
	}()
	f()
	return nil
}
