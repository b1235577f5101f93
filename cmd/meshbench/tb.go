package main

import (
	"fmt"
	"sync"
	"testing"
)

// fixtureTB lets the test servers (test/istioca, test/xdsserver), which take a
// testing.TB, run inside this program. Only the methods those helpers call
// are implemented: Helper, Cleanup, Fatal, Fatalf, Logf and Name.
// Fatal and Fatalf panic with a fixtureError, which catchFixture turns into an
// error; Close runs the cleanups in reverse order.
type fixtureTB struct {
	testing.TB // nil: any other method panics, so a new use is noticed at once

	mu       sync.Mutex
	cleanups []func()
}

// fixtureError is the panic value of fixtureTB.Fatal and Fatalf.
type fixtureError struct{ msg string }

func (e fixtureError) Error() string { return e.msg }

func (t *fixtureTB) Helper()      {}
func (t *fixtureTB) Name() string { return "meshbench" }

func (t *fixtureTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *fixtureTB) Fatal(args ...any) { panic(fixtureError{fmt.Sprint(args...)}) }

func (t *fixtureTB) Fatalf(format string, args ...any) {
	panic(fixtureError{fmt.Sprintf(format, args...)})
}

func (t *fixtureTB) Logf(string, ...any) {}

// Close runs the registered cleanups, newest first. It is safe to call twice.
func (t *fixtureTB) Close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// catchFixture runs f and turns a fixtureTB failure inside it into an error.
// Other panics go on.
func catchFixture(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fixtureError)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	f()
	return nil
}
