package settings

import (
	"errors"
	"strings"
	"testing"
)

// FuzzValueParsers feeds arbitrary text to every setting's parser. A parser
// never panics; an error is a reason; an accepted value shown and parsed
// again gives the same value.
func FuzzValueParsers(f *testing.F) {
	for _, s := range Registry {
		f.Add(s.Name, s.Default)
	}
	f.Add("MESHAGENT_NODE_UID_IDENTITIES", " 7=spiffe://td/b , 0=spiffe://td/a")
	for _, seed := range []string{"", " ", "true", "0", "-1", "1e309", "NaN", "Inf", "0x10", "24h", "-5s", "a:b", ":1", "host:0", "[::1]:15012",
		"SYSTEM", "ec-p256", "EC-P256", "citadel", "{}", "null", `{"statusPort":"80"}`, `{"statusPort":1.5}`, "\x00", "a\nb", "\xff",
		"1337,0", " 1 , ,2", "4294967295", "+5", "1,-1"} {
		f.Add("", seed)
	}
	f.Fuzz(func(t *testing.T, name, raw string) {
		for i := range Registry {
			s := &Registry[i]
			if s.Value.set == nil || (name != "" && name != s.Name) {
				continue
			}
			c := &Config{}
			err := s.Value.set(c, raw)
			if err != nil {
				var r reason
				if !errors.As(err, &r) {
					t.Fatalf("%s: error %T is not a reason", s.Name, err)
				}
				e := (&InvalidError{Name: s.Name, Value: raw, Why: err.Error()}).Error()
				if strings.ContainsAny(e, "\n\r") {
					t.Fatalf("%s: error not one line: %q", s.Name, e)
				}
				continue
			}
			shown := s.Value.get(c)
			c2 := &Config{}
			if err := s.Value.set(c2, shown); err != nil {
				t.Fatalf("%s: %q accepted, shown as %q, which is rejected: %v", s.Name, raw, shown, err)
			}
			if again := s.Value.get(c2); again != shown {
				t.Fatalf("%s: %q shown as %q, then as %q", s.Name, raw, shown, again)
			}
		}
	})
}

// FuzzParseProxyConfig: never a panic; an accepted config has a valid address
// and port.
func FuzzParseProxyConfig(f *testing.F) {
	for _, seed := range []string{
		`{"discoveryAddress":"istiod.istio-system.svc:15012","statusPort":15020}`,
		`{"discovery_address":"a:1","status_port":"2"}`,
		`{"discoveryAddress":"","statusPort":0,"tracing":{"zipkin":{}}}`,
		`{"terminationDrainDuration":"5s"}`, `{"termination_drain_duration":"0.5s"}`, `{"terminationDrainDuration":"-1s"}`,
		`{"statusPort":-1}`, `{"statusPort":1e3}`, `{"statusPort":"x"}`, `{"discoveryAddress":5}`,
		`{`, `[]`, `null`, `""`, ``, `{} {}`, `{"a":` + strings.Repeat("[", 100),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		pc, err := ParseProxyConfig(raw)
		if err != nil {
			if strings.ContainsAny((&InvalidError{Name: "PROXY_CONFIG", Value: raw, Why: err.Error()}).Error(), "\r\n") {
				t.Fatalf("error not one line: %v", err)
			}
			return
		}
		if pc.DiscoveryAddress != "" {
			if err := checkHostPort(pc.DiscoveryAddress); err != nil {
				t.Fatalf("accepted bad address %q", pc.DiscoveryAddress)
			}
		}
		if pc.StatusPort < 0 || pc.StatusPort > 65535 {
			t.Fatalf("accepted port %d", pc.StatusPort)
		}
		if d := pc.TerminationDrainDuration; d != nil && *d < 0 {
			t.Fatalf("accepted drain %v", *d)
		}
	})
}

// FuzzResolve sets one variable to arbitrary text: Resolve either succeeds or
// returns one *InvalidError line naming a variable.
func FuzzResolve(f *testing.F) {
	f.Add("CA_PROVIDER", "Bogus")
	f.Add("CA_HEADER_x", "v")
	f.Add("PROXY_CONFIG", `{"statusPort":1}`)
	f.Add("XDS_HEADER_", "")
	f.Add("MESHAGENT_MODE", "node")
	f.Add("MESHAGENT_BROKER_SOCKET", "broker/socket")
	f.Add("MESHAGENT_NODE_UID_IDENTITIES", "0=spiffe://td/a")
	f.Fuzz(func(t *testing.T, name, value string) {
		c, err := Resolve(Input{Env: []string{name + "=" + value}, FileExists: func(string) bool { return false }})
		if err != nil {
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("error %T: %v", err, err)
			}
			if !strings.HasPrefix(err.Error(), "invalid ") || strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("bad error line %q", err)
			}
			return
		}
		if len(c.Table()) != len(Registry) {
			t.Fatal("table incomplete")
		}
	})
}
