//go:build !linux

package brokerapi

import "errors"

type processPin struct{ fd int }

var errNoProcess = errors.New("no such process")

func pinProcess(int32) (*processPin, error) {
	return nil, errors.New("pid references need Linux pidfds")
}

func (p *processPin) exited() <-chan struct{} { return nil }
func (p *processPin) close()                  {}

func (p *processPin) closeIfSet() {}
