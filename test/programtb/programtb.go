// Package programtb lets the protocol test servers in test/ (which take a
// testing.TB) run inside a program such as cmd/meshbench or cmd/meshsoak.
//
// TB implements only what those servers call: Helper, Cleanup, Fatal, Fatalf,
// Logf and Name. Any other method panics on the nil embedded testing.TB, so a
// new use is noticed at once. Fatal and Fatalf panic with a value that Guard
// turns into an error. TB is safe for concurrent use.
package programtb

import (
	"fmt"
	"sync"
	"testing"
)

// TB is a testing.TB for use outside tests.
type TB struct {
	testing.TB // nil on purpose

	name     string
	mu       sync.Mutex
	cleanups []func()
}

// New returns a TB that reports name as its Name.
func New(name string) *TB { return &TB{name: name} }

// Failure is the panic value of Fatal and Fatalf, returned by Guard.
type Failure struct{ msg string }

func (f Failure) Error() string { return f.msg }

func (t *TB) Helper()             {}
func (t *TB) Name() string        { return t.name }
func (t *TB) Logf(string, ...any) {}
func (t *TB) Fatal(args ...any)   { panic(Failure{fmt.Sprint(args...)}) }
func (t *TB) Fatalf(format string, args ...any) {
	panic(Failure{fmt.Sprintf(format, args...)})
}

// Cleanup registers f to run at Close.
func (t *TB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// Close runs the registered cleanups, newest first. It is safe to call twice.
func (t *TB) Close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Guard runs f and returns a Fatal or Fatalf inside it as an error. Other
// panics go on.
func Guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(Failure)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	f()
	return nil
}
