package settings

import (
	"strconv"
	"strings"
)

// Group sorts settings in the docs.
type Group string

// The groups, in the order the docs list them.
const (
	GroupIstio     Group = "Istio-compatible settings"
	GroupMeshagent Group = "meshagent settings"
	GroupPaths     Group = "Paths"
)

// Groups lists the groups in docs order.
var Groups = []Group{GroupIstio, GroupMeshagent, GroupPaths}

// Setting declares one configuration input. Every setting is declared once, in
// Registry; parsing, validation, `meshagent config` and docs/configuration.md
// are all derived from the declaration.
type Setting struct {
	// Name is the environment variable. For a Prefix setting it is the prefix
	// followed by "<NAME>", e.g. "CA_HEADER_<NAME>".
	Name string
	// Flag is the command-line flag name without dashes; empty for none.
	Flag string
	// Default is the value used when neither the environment nor a flag sets
	// it, in the same text form a user would write. Empty means none.
	Default string
	// DerivedDefault, when set, explains a default that is computed from
	// other settings; Resolve computes it (see derive.go).
	DerivedDefault string
	// Doc says what the setting does, in one or two sentences.
	Doc string
	// Group places the setting in the docs.
	Group Group
	// Value parses, checks and stores the setting into Config.
	Value Value
	// Unused, when set, says why the resolved value has no effect, or
	// returns "" when it has one. Config.Warnings collects these for the
	// agent to log at start-up; a setting loses its Unused once the agent
	// acts on every value it accepts.
	Unused func(c *Config, set bool) string
}

// Prefix reports whether the setting collects every variable starting with a
// prefix (CA_HEADER_<NAME>), and returns the prefix.
func (s *Setting) Prefix() (string, bool) {
	if s.Value.headers == nil {
		return "", false
	}
	return strings.CutSuffix(s.Name, "<NAME>")
}

// FlagName returns "--flag", or "" when the setting has no flag.
func (s *Setting) FlagName() string {
	if s.Flag == "" {
		return ""
	}
	return "--" + s.Flag
}

// Source says where a resolved value came from.
type Source string

// The sources, from weakest to strongest.
const (
	SourceDefault Source = "default"
	SourceEnv     Source = "env"
	SourceFlag    Source = "flag"
)

// Row is one line of the resolved-configuration table.
type Row struct {
	// Name is the environment variable.
	Name string `json:"name"`
	// Flag is "--flag" or empty.
	Flag string `json:"flag,omitempty"`
	// Value is the resolved value as text (header values are redacted).
	Value string `json:"value"`
	// Source is default, env or flag.
	Source Source `json:"source"`
	// Note explains a derived value, e.g. "from PROXY_CONFIG discoveryAddress".
	Note string `json:"note,omitempty"`
	// Doc is the setting's doc string.
	Doc string `json:"doc"`
}

// InvalidError is a bad setting value. Its message is one line:
// invalid <NAME>="<value>": <what is accepted>.
type InvalidError struct {
	// Name is the environment variable, or "--flag" when the value came from a flag.
	Name string
	// Value is the rejected text.
	Value string
	// Why says what is accepted or what is wrong.
	Why string
}

func (e *InvalidError) Error() string {
	name := e.Name
	if q := strconv.Quote(name); q != `"`+name+`"` {
		name = q // a variable name with control characters: keep the line whole
	}
	return "invalid " + name + "=" + strconv.Quote(e.Value) + ": " + oneLine(e.Why)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
