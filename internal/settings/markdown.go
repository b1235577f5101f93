package settings

import (
	"bytes"
	"fmt"
	"strings"
)

// Markdown renders the configuration reference (docs/configuration.md) from
// the Registry.
func Markdown() []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from internal/settings/registry.go by "make docs". Do not edit by hand. -->

meshagent reads its configuration from environment variables (the names and
defaults of Istio's pilot-agent, plus its own ` + "`MESHAGENT_*`" + ` settings) and from
command-line flags of ` + "`meshagent run`" + ` and ` + "`meshagent config`" + `.

- A flag overrides the environment, which overrides the default.
- A variable set to the empty string counts as unset.
- A bad value stops the agent at start-up with exit code 2 and one line:
  ` + "`invalid <NAME>=\"<value>\": <what is accepted>`" + `.
- Relative paths are relative to the working directory, as in pilot-agent.
- ` + "`meshagent config`" + ` prints every setting with its value and where the value came
  from (` + "`default`, `env` or `flag`" + `), and the certificate source the agent would
  choose, without starting anything. ` + "`meshagent config -o json`" + ` prints the same as JSON.

`)
	for _, g := range Groups {
		fmt.Fprintf(&b, "## %s\n\n", g)
		b.WriteString("| Variable | Flag | Default |\n|---|---|---|\n")
		for i := range Registry {
			s := &Registry[i]
			if s.Group != g {
				continue
			}
			fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s |\n", s.Name, anchor(s.Name), code(s.FlagName()), cell(md(defaultText(s))))
		}
		b.WriteString("\n")
		for i := range Registry {
			s := &Registry[i]
			if s.Group != g {
				continue
			}
			fmt.Fprintf(&b, "### %s\n\n%s\n\n", md(s.Name), md(s.Doc))
			if s.Flag != "" {
				fmt.Fprintf(&b, "- Flag: `%s`\n", s.FlagName())
			}
			fmt.Fprintf(&b, "- Type: %s; accepted: %s\n", md(s.Value.Type), md(s.Value.Accepted))
			fmt.Fprintf(&b, "- Default: %s\n\n", md(defaultText(s)))
		}
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

func defaultText(s *Setting) string {
	switch {
	case s.DerivedDefault != "":
		return s.DerivedDefault
	case s.Default != "":
		return "`" + s.Default + "`"
	default:
		return "none"
	}
}

func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// md escapes the characters Markdown would read as HTML outside code spans.
func md(s string) string {
	parts := strings.Split(s, "`")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = strings.NewReplacer("<", `\<`, ">", `\>`).Replace(parts[i])
	}
	return strings.Join(parts, "`")
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// anchor is the GitHub heading anchor of a setting's section.
func anchor(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
