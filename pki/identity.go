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

// SPIFFEIdentity returns the identity spiffe://<trustDomain>/ns/<ns>/sa/<sa>.
func SPIFFEIdentity(trustDomain, namespace, serviceAccount string) Identity {
	return Identity{SPIFFEID: "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/" + serviceAccount}
}

// LinkerdIdentity returns <sa>.<ns>.serviceaccount.identity.<controlNS>.<trustDomain>.
func LinkerdIdentity(trustDomain, namespace, serviceAccount, controlNamespace string) Identity {
	return Identity{DNSName: serviceAccount + "." + namespace + ".serviceaccount.identity." + controlNamespace + "." + trustDomain}
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
		_, err := i.URI()
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

// URI parses the SPIFFE ID.
func (i Identity) URI() (*url.URL, error) {
	u, err := url.Parse(i.SPIFFEID)
	if err != nil {
		return nil, fmt.Errorf("SPIFFE ID %q: %w", i.SPIFFEID, err)
	}
	if u.Scheme != "spiffe" || u.Host == "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("SPIFFE ID %q: want spiffe://<trust-domain>/<path>", i.SPIFFEID)
	}
	return u, nil
}

// ParseIdentity reads an identity as String prints it: a spiffe:// URI is a
// SPIFFE ID (checked with go-spiffe's spiffeid rules), anything else a
// DNS-like name (Linkerd).
func ParseIdentity(s string) (Identity, error) {
	if strings.HasPrefix(s, "spiffe://") {
		id, err := spiffeid.FromString(s)
		if err != nil {
			return Identity{}, fmt.Errorf("SPIFFE ID %.200q: %w", s, err)
		}
		return Identity{SPIFFEID: id.String()}, nil
	}
	id := Identity{DNSName: s}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}
