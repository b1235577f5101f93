package pki

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Identity is the name a workload certificate is issued for: either a SPIFFE ID
// (carried as a URI SAN, the Istio CA protocol) or a DNS-like name (carried as
// the only DNS SAN, the Linkerd identity protocol). Exactly one field is set.
type Identity struct {
	SPIFFEID string
	DNSName  string
}

// SPIFFEIdentity returns the identity spiffe://<trustDomain>/ns/<ns>/sa/<sa>
// without checking the names (for names known to be good, such as
// constants); Scheme.Identity checks them.
func SPIFFEIdentity(trustDomain, namespace, serviceAccount string) Identity {
	return Identity{SPIFFEID: "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/" + serviceAccount}
}

// LinkerdIdentity returns <sa>.<ns>.serviceaccount.identity.<controlNS>.<trustDomain>
// without checking the names (for names known to be good, such as
// constants); Scheme.Identity checks them.
func LinkerdIdentity(trustDomain, namespace, serviceAccount, controlNamespace string) Identity {
	return Identity{DNSName: serviceAccount + "." + namespace + linkerdSuffix(trustDomain, controlNamespace)}
}

// linkerdSuffix is what follows "<sa>.<ns>" in a Linkerd identity.
func linkerdSuffix(trustDomain, controlNamespace string) string {
	return ".serviceaccount.identity." + controlNamespace + "." + trustDomain
}

// String returns the SPIFFE ID or the DNS name.
func (i Identity) String() string {
	if i.SPIFFEID != "" {
		return i.SPIFFEID
	}
	return i.DNSName
}

// IsZero reports whether no identity is set.
func (i Identity) IsZero() bool { return i.SPIFFEID == "" && i.DNSName == "" }

// Validate checks that exactly one form is set and that it is well formed.
func (i Identity) Validate() error {
	switch {
	case i.SPIFFEID != "" && i.DNSName != "":
		return errors.New("identity has both a SPIFFE ID and a DNS name")
	case i.SPIFFEID != "":
		_, err := i.SPIFFE()
		return err
	case i.DNSName != "":
		if strings.ContainsAny(i.DNSName, " /:@") || strings.HasPrefix(i.DNSName, ".") || strings.HasSuffix(i.DNSName, ".") || strings.Contains(i.DNSName, "..") {
			return fmt.Errorf("identity %q is not a DNS name", i.DNSName)
		}
		return nil
	default:
		return errors.New("identity is empty")
	}
}

// SPIFFE parses the SPIFFE ID by the SPIFFE standard (go-spiffe's
// spiffeid): a lower-case trust domain, a path of non-empty segments of
// letters, digits, '.', '-' and '_' other than "." and "..", and nothing else
// (no user, port, query or fragment).
func (i Identity) SPIFFE() (spiffeid.ID, error) {
	id, err := spiffeid.FromString(i.SPIFFEID)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("SPIFFE ID %q: %w", i.SPIFFEID, err)
	}
	return id, nil
}

// URI parses the SPIFFE ID (see SPIFFE) into a URL.
func (i Identity) URI() (*url.URL, error) {
	id, err := i.SPIFFE()
	if err != nil {
		return nil, err
	}
	return id.URL(), nil
}

// Matches reports whether i and other name the same workload: equal SPIFFE
// IDs (compared as parsed IDs; an ID that does not parse matches nothing),
// or equal DNS names.
func (i Identity) Matches(other Identity) bool {
	switch {
	case i.SPIFFEID != "" && other.SPIFFEID != "":
		a, errA := i.SPIFFE()
		b, errB := other.SPIFFE()
		return errA == nil && errB == nil && a == b
	case i.DNSName != "" && other.DNSName != "":
		return i.SPIFFEID == "" && other.SPIFFEID == "" && i.DNSName == other.DNSName
	}
	return false
}

// ParseIdentity reads an identity as String prints it: a spiffe:// URI is a
// SPIFFE ID (checked with go-spiffe's spiffeid rules), anything else a
// DNS-like name (Linkerd).
func ParseIdentity(s string) (Identity, error) {
	if strings.HasPrefix(s, "spiffe://") {
		id, err := Identity{SPIFFEID: s}.SPIFFE()
		if err != nil {
			return Identity{}, err
		}
		return Identity{SPIFFEID: id.String()}, nil
	}
	id := Identity{DNSName: s}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}
