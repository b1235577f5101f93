package podresolver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshagent/meshagent/internal/pki"
)

// ParseNodeUIDs reads the identities of node processes, by uid, written as
// "<uid>=<spiffe id>" separated by commas (spaces around items are
// ignored): "0=spiffe://cluster.local/ns/kube-system/sa/node-probe". An empty
// string is no identity. A uid given twice is an error.
func ParseNodeUIDs(s string) (map[uint32]pki.Identity, error) {
	out := map[uint32]pki.Identity{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		uidText, idText, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("node uid identity %q: want <uid>=<spiffe id>", item)
		}
		uid, err := strconv.ParseUint(strings.TrimSpace(uidText), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("node uid identity %q: uid: %w", item, err)
		}
		sid, err := spiffeid.FromString(strings.TrimSpace(idText))
		if err != nil {
			return nil, fmt.Errorf("node uid identity %q: %w", item, err)
		}
		if _, dup := out[uint32(uid)]; dup {
			return nil, fmt.Errorf("node uid identity %q: uid %d given twice", item, uid)
		}
		out[uint32(uid)] = pki.Identity{SPIFFEID: sid.String()}
	}
	return out, nil
}
