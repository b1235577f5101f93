package settings

import (
	"errors"
	"net"
	"os"
	"slices"
	"strings"
)

// Input is what Resolve reads.
type Input struct {
	// Env is the environment as "NAME=value" strings, as os.Environ returns it.
	Env []string
	// Flags holds the flags given on the command line, by flag name without
	// dashes. Flags not given must be absent.
	Flags map[string]string
	// FileExists reports whether a file exists; it decides the derived
	// XDS_ROOT_CA. Nil means a stat relative to the working directory.
	FileExists func(path string) bool
	// InterfaceAddrs lists the host's addresses; it decides the derived
	// INSTANCE_IP. Nil means net.InterfaceAddrs.
	InterfaceAddrs func() ([]net.Addr, error)
}

// Resolve turns defaults, the environment and flags into a Config: a flag
// overrides the environment, which overrides the default. A variable set to
// the empty string counts as unset. The first bad value (in registry order),
// else the first combination of settings that cannot work together
// (validate.go), is returned as an *InvalidError; nothing else is returned
// on error.
func Resolve(in Input) (*Config, error) {
	env := envMap(in.Env)
	if in.FileExists == nil {
		in.FileExists = fileExists
	}
	r := &resolution{
		c:       &Config{CAHeaders: map[string]string{}, XDSHeaders: map[string]string{}},
		sources: make(map[string]Source, len(Registry)),
		notes:   map[string]string{},
	}
	for i := range Registry {
		s := &Registry[i]
		if prefix, ok := s.Prefix(); ok {
			if err := r.collectPrefix(s, prefix, in.Env); err != nil {
				return nil, err
			}
			continue
		}
		raw, src, name := s.Default, SourceDefault, s.Name
		if v := env[s.Name]; v != "" {
			raw, src = v, SourceEnv
		}
		if s.Flag != "" {
			if v, ok := in.Flags[s.Flag]; ok && v != "" {
				raw, src, name = v, SourceFlag, s.FlagName()
			}
		}
		r.sources[s.Name] = src
		if raw == "" {
			continue
		}
		if err := s.Value.set(r.c, raw); err != nil {
			return nil, invalid(name, raw, s, err)
		}
	}
	if err := r.derive(in); err != nil {
		return nil, err
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	r.c.unknown = UnknownNames(in.Env)
	r.c.rows = make([]Row, 0, len(Registry))
	for i := range Registry {
		s := &Registry[i]
		r.c.rows = append(r.c.rows, Row{
			Name:   s.Name,
			Flag:   s.FlagName(),
			Value:  s.Value.get(r.c),
			Source: r.sources[s.Name],
			Note:   r.notes[s.Name],
			Doc:    s.Doc,
		})
	}
	return r.c, nil
}

// resolution is the state of one Resolve call.
type resolution struct {
	c       *Config
	sources map[string]Source
	notes   map[string]string
}

// isSet reports whether the user set the named setting.
func (r *resolution) isSet(name string) bool { return r.sources[name] != SourceDefault }

func (r *resolution) collectPrefix(s *Setting, prefix string, env []string) error {
	r.sources[s.Name] = SourceDefault
	m := *s.Value.headers(r.c)
	seen := map[string]bool{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		name, ok := strings.CutPrefix(k, prefix)
		if !ok || seen[k] {
			continue
		}
		seen[k] = true
		if err := checkHeaderName(name); err != nil {
			return invalid(k, v, s, err)
		}
		if err := checkHeaderValue(v); err != nil {
			return invalid(k, "<redacted>", s, err)
		}
		m[name] = v
		r.sources[s.Name] = SourceEnv
	}
	return nil
}

func invalid(name, raw string, s *Setting, err error) error {
	why := err.Error()
	var rs reason
	if !errors.As(err, &rs) {
		why = s.Value.Accepted
	}
	return &InvalidError{Name: name, Value: raw, Why: why}
}

// envMap maps names to values; the first occurrence of a name wins, as in os.Getenv.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if _, dup := m[k]; !dup {
			m[k] = v
		}
	}
	return m
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}

// SettingByName returns the registry entry for an environment variable (for a
// prefix setting, its "<PREFIX><NAME>" name), or nil.
func SettingByName(name string) *Setting {
	i := slices.IndexFunc(Registry, func(s Setting) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return &Registry[i]
}

// SettingByFlag returns the registry entry with the flag name (without
// dashes), or nil.
func SettingByFlag(flag string) *Setting {
	i := slices.IndexFunc(Registry, func(s Setting) bool { return s.Flag != "" && s.Flag == flag })
	if i < 0 {
		return nil
	}
	return &Registry[i]
}
