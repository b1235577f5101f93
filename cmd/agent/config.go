package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/settings"
)

// configReport is `meshagent config -o json`.
type configReport struct {
	Settings []settings.Row `json:"settings"`
	// Source is where certificates come from, and why.
	Source app.SourceDecision `json:"source"`
	// Mode is Source under its former name (deprecated: "mode" is
	// MESHAGENT_MODE's word; the alias goes in the next release).
	Mode app.SourceDecision `json:"mode"`
	// Warnings name the settings whose value has no effect.
	Warnings []string `json:"warnings,omitempty"`
}

// printConfig writes every setting with its value and source, and the
// certificate source.
func printConfig(w io.Writer, cfg *settings.Config, source app.SourceDecision, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		var warnings []string
		for _, wn := range cfg.Warnings() {
			warnings = append(warnings, wn.String())
		}
		for _, wn := range cfg.Unknown() {
			warnings = append(warnings, unknownString(wn))
		}
		return enc.Encode(configReport{Settings: cfg.Table(), Source: source, Mode: source, Warnings: warnings})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tSOURCE\tNOTE")
	for _, r := range cfg.Table() {
		value := r.Value
		if value == "" {
			value = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, value, r.Source, r.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, wn := range cfg.Warnings() {
		fmt.Fprintf(w, "\nwarning: %s", wn)
	}
	for _, wn := range cfg.Unknown() {
		fmt.Fprintf(w, "\nwarning: %s", unknownString(wn))
	}
	_, err := fmt.Fprintf(w, "\nsource: %s (%s)\n", source.Source, source.Reason)
	return err
}

// unknownString is an unknown name's warning: "MESHAGENT_DEVV ignored: no
// such setting; did you mean MESHAGENT_DEV?".
func unknownString(w settings.Warning) string {
	if w.Name == w.Value {
		return w.Name + " ignored: " + w.Why
	}
	return w.Name + " " + w.Value + " ignored: " + w.Why
}
