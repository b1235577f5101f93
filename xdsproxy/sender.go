package xdsproxy

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
)

// errSendBacklog ends an upstream stream that stopped taking requests.
var errSendBacklog = errors.New("upstream stopped reading requests")

// sender feeds one upstream stream from a queue, in order, from its own
// goroutine. Enqueueing never blocks, so neither the downstream reader nor
// the subscription re-send waits on upstream flow control. Without it, a
// control plane busy pushing a large response (which it cannot finish until
// the proxy reads it) could stop reading requests while the proxy, blocked
// sending one, stopped reading responses: a deadlock.
type sender struct {
	stream grpc.ClientStream
	// fail ends the stream attempt with a cause.
	fail  context.CancelCauseFunc
	limit int // queued bytes beyond which the stream is failed
	m     *metrics

	mu     sync.Mutex
	queue  []*frame
	queued int
	closed bool

	wake chan struct{} // 1-slot: there is work
	done chan struct{} // closed when run returns
}

func newSender(stream grpc.ClientStream, fail context.CancelCauseFunc, limit int, m *metrics) *sender {
	return &sender{
		stream: stream,
		fail:   fail,
		limit:  limit,
		m:      m,
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

// enqueue takes ownership of f and queues it for the stream.
func (s *sender) enqueue(f *frame) {
	n := f.data.Len()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		f.free()
		return
	}
	if s.queued+n > s.limit {
		s.mu.Unlock()
		f.free()
		s.fail(errSendBacklog)
		return
	}
	s.queue = append(s.queue, f)
	s.queued += n
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run sends queued frames until ctx ends or a send fails (RecvMsg on the
// stream then says why).
func (s *sender) run(ctx context.Context) {
	defer close(s.done)
	defer s.drain()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			f := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			n := f.data.Len()
			s.queued -= n
			s.mu.Unlock()

			err := s.stream.SendMsg(f)
			f.free()
			if err != nil {
				return
			}
			s.m.messages.WithLabelValues(toUpstream).Inc()
			s.m.bytes.WithLabelValues(toUpstream).Add(float64(n))
		}
	}
}

// drain closes the queue and releases what is left in it.
func (s *sender) drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, f := range s.queue {
		f.free()
	}
	s.queue, s.queued = nil, 0
}
