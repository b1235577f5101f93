package xdsproxy

import (
	"errors"

	"google.golang.org/grpc/mem"
)

// A tracker remembers what a downstream client has subscribed to, so the
// subscriptions can be restored on a new upstream stream. There is one per
// downstream stream, for its protocol (SotW or delta). Trackers are not safe
// for concurrent use: the session calls them under its lock.
type tracker interface {
	// request records a decoded-on-the-spot downstream request and says what
	// to send upstream. gen is the current upstream stream's generation.
	request(raw []byte, gen uint64) (verdict, []byte, error)
	// response records an upstream response that is about to be forwarded
	// downstream.
	response(data mem.BufferSlice, gen uint64) error
	// resubscribe returns the requests that restore every subscription on a
	// fresh upstream stream: the node on the first, no nonces.
	resubscribe() ([][]byte, error)
}

// verdict says what to do with a downstream request.
type verdict int

const (
	// forward sends the request upstream as received.
	forward verdict = iota
	// rewrite sends the re-encoded request instead.
	rewrite
	// drop sends nothing: the request only answers a response from an
	// upstream stream that no longer exists.
	drop
)

// Limits on what one downstream stream may make the proxy remember.
const (
	// maxTypes bounds the distinct type URLs per stream.
	maxTypes = 256
	// maxUnanswered bounds the responses per type awaiting an ACK or NACK.
	maxUnanswered = 64
)

var (
	errNoTypeURL    = errors.New("type_url is required on an aggregated stream")
	errTooManyTypes = errors.New("too many resource types on one stream")
)

// sentResponse is a response forwarded downstream and not yet answered.
type sentResponse struct {
	gen     uint64 // the upstream stream it came from
	nonce   string
	changed []resourceVersionInfo // delta only: resources it carried
	removed []string              // delta only: names it removed
}

// responseLogs holds one responseLog per type URL, at most maxTypes of them.
type responseLogs map[string]*responseLog

// get returns the log of typeURL, making it on first use.
func (m responseLogs) get(typeURL string) (*responseLog, error) {
	l, ok := m[typeURL]
	if !ok {
		if len(m) >= maxTypes {
			return nil, errTooManyTypes
		}
		l = &responseLog{}
		m[typeURL] = l
	}
	return l, nil
}

// responseLog is the per-type record of forwarded responses, oldest first.
type responseLog struct {
	sent        []sentResponse
	latestNonce string
	latestGen   uint64
}

func (l *responseLog) add(r sentResponse) {
	if len(l.sent) == maxUnanswered {
		l.sent = append(l.sent[:0], l.sent[1:]...)
	}
	l.sent = append(l.sent, r)
	l.latestNonce, l.latestGen = r.nonce, r.gen
}

// answer finds the oldest unanswered response with this nonce (clients answer
// in order, and nonces from different upstream streams may repeat) and
// forgets it and everything before it.
func (l *responseLog) answer(nonce string) (sentResponse, bool) {
	for i, r := range l.sent {
		if r.nonce == nonce {
			l.sent = append(l.sent[:0], l.sent[i+1:]...)
			return r, true
		}
	}
	return sentResponse{}, false
}

// latest is the nonce of the newest response from upstream stream gen, or "".
func (l *responseLog) latest(gen uint64) string {
	if l.latestGen == gen {
		return l.latestNonce
	}
	return ""
}

// staleness classifies a request's nonce: stale means it answers a response
// from an earlier upstream stream, which the current one knows nothing of.
// An unknown nonce is left for the upstream to judge.
func (l *responseLog) staleness(nonce string, gen uint64) (entry sentResponse, found, stale bool) {
	if nonce == "" {
		return sentResponse{}, false, false
	}
	entry, found = l.answer(nonce)
	return entry, found, found && entry.gen != gen
}
