package settings

import (
	"slices"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshagent/meshagent/internal/pki"
)

// ParseNodeUIDs parses MESHAGENT_NODE_UID_IDENTITIES, the identities of
// node processes by uid, written as "<uid>=<spiffe id>" separated by commas
// (spaces around items are ignored):
// "0=spiffe://cluster.local/ns/kube-system/sa/node-probe". An empty string
// is no identity. A uid given twice is an error.
func ParseNodeUIDs(s string) (map[uint32]pki.Identity, error) {
	out := map[uint32]pki.Identity{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		uidText, idText, ok := strings.Cut(item, "=")
		if !ok {
			return nil, reason("node uid identity " + quoteShort(item) + ": want <uid>=<spiffe id>")
		}
		uid, err := strconv.ParseUint(strings.TrimSpace(uidText), 10, 32)
		if err != nil {
			return nil, reason("node uid identity " + quoteShort(item) + ": uid: " + oneLine(err.Error()))
		}
		sid, err := spiffeid.FromString(strings.TrimSpace(idText))
		if err != nil {
			return nil, reason("node uid identity " + quoteShort(item) + ": " + oneLine(err.Error()))
		}
		if _, dup := out[uint32(uid)]; dup {
			return nil, reason("node uid identity " + quoteShort(item) + ": uid " + strconv.FormatUint(uid, 10) + " given twice")
		}
		out[uint32(uid)] = pki.Identity{SPIFFEID: sid.String()}
	}
	return out, nil
}

// NodeUIDs is a MESHAGENT_NODE_UID_IDENTITIES setting, shown with its uids
// in ascending order.
func NodeUIDs(field func(*Config) *map[uint32]pki.Identity) Value {
	return Value{
		Type:     "uid identities",
		Accepted: "<uid>=<spiffe id> separated by commas, or empty for none",
		set: func(c *Config, raw string) error {
			m, err := ParseNodeUIDs(raw)
			if err != nil {
				return err
			}
			*field(c) = m
			return nil
		},
		get: func(c *Config) string {
			m := *field(c)
			uids := make([]uint32, 0, len(m))
			for uid := range m {
				uids = append(uids, uid)
			}
			slices.Sort(uids)
			parts := make([]string, len(uids))
			for i, uid := range uids {
				parts[i] = strconv.FormatUint(uint64(uid), 10) + "=" + m[uid].String()
			}
			return strings.Join(parts, ",")
		},
	}
}
