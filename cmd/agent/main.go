// Command meshagent is a workload identity agent: it obtains short-lived
// workload certificates from the mesh CA, keeps them fresh, serves them
// over SDS and the SPIFFE Workload API, and proxies Envoy's ADS stream to
// the control plane.
//
// Subcommands:
//   - run (the agent)
//   - config (the resolved configuration and the certificate source run would choose)
//   - version (the build)
//   - socket-dir (the node chart's init container: gives the socket's host directory to the agent's uid)
//   - csi (the node chart's CSI driver: mounts the socket directory into pods)
//   - socket-holder (the node chart's sidecar: keeps the socket answering while the agent restarts)
//   - trust-publisher (keeps the Pod Certificates signer's ClusterTrustBundle, once per cluster)
//
// Exit codes: 0 after a clean stop (SIGTERM, SIGINT, /quitquitquit), 1 when
// the agent fails while running, 2 for bad configuration or usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshagent/meshagent/internal/app"
	"github.com/meshagent/meshagent/internal/settings"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitConfig  = 2
)

func main() {
	if err := notDumpable(); err != nil {
		fmt.Fprintln(os.Stderr, "meshagent: "+err.Error())
		os.Exit(exitFailure)
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run executes the command line args with the environment env and returns
// the process exit code.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) int {
	return execute(ctx, args, env, stdout, stderr, hooks{})
}

// hooks let tests observe a running agent.
type hooks struct {
	// statusListening is called with the status server's address.
	statusListening func(net.Addr)
}

// exitError is how a command ends with an exit code other than 0: exitConfig
// for a problem with the configuration or the command line (the error is the
// first line on stderr, then the log lines held while it was found),
// exitFailure for a failure at run time (printed, unless the log has it).
type exitError struct {
	code int
	err  error
	// logged: the failure is in the log already; nothing more is printed.
	logged bool
	// held, when set, holds the log lines written while the configuration
	// was checked; they are released after the error's line.
	held *heldWriter
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// configError is a problem with the configuration or the command line: exit 2.
func configError(err error) error { return &exitError{code: exitConfig, err: err} }

// runFailure is a failure at run time, printed on stderr: exit 1.
func runFailure(err error) error { return &exitError{code: exitFailure, err: err} }

// failureLogged is a failure at run time that the agent's log reported: exit 1.
func failureLogged(err error) error { return &exitError{code: exitFailure, err: err, logged: true} }

func execute(ctx context.Context, args, env []string, stdout, stderr io.Writer, h hooks) int {
	root := newRootCommand(env, stdout, stderr, h)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// cobra's own errors: an unknown command or flag.
		fmt.Fprintln(stderr, "meshagent: "+err.Error())
		return exitConfig
	}
	switch {
	case ee.code == exitConfig:
		fmt.Fprintln(stderr, ee.Error())
		if ee.held != nil {
			ee.held.release()
		}
	case !ee.logged:
		fmt.Fprintln(stderr, "meshagent: "+ee.Error())
	}
	return ee.code
}

func newRootCommand(env []string, stdout, stderr io.Writer, h hooks) *cobra.Command {
	root := &cobra.Command{
		Use:           "meshagent",
		Short:         "Workload identity agent: SPIFFE certificates over SDS and an xDS proxy for Envoy",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	// --version is the root's own flag, not cobra's Version field: cobra
	// prints that through a text/template, and text/template's reflective
	// method calls make the linker keep every exported method of every type
	// put in an interface (~4 MB of text and tables in every sidecar, see
	// docs/performance.md).
	showVersion := root.Flags().BoolP("version", "v", false, "print the version")
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if *showVersion {
			fmt.Fprintln(stdout, versionString())
			return nil
		}
		return cmd.Help()
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return configError(err) })

	root.AddCommand(newRunCommand(env, stderr, h), newConfigCommand(env, stdout, stderr), newVersionCommand(stdout), newDocsCommand(stdout), newCSICommand(stderr))
	root.AddCommand(newSocketDirCommand(), newTrustPublisherCommand(env, stderr), newSocketHolderCommand(stderr))
	return root
}

// newRunCommand is `meshagent run`.
func newRunCommand(env []string, stderr io.Writer, h hooks) *cobra.Command {
	runCmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := nodeFlag(cmd); err != nil {
				return err
			}
			cfg, err := resolve(cmd.Flags(), env)
			if err != nil {
				return err
			}
			return runAgent(cmd.Context(), cfg, stderr, h)
		},
	}
	addSettingFlags(runCmd.Flags())
	runCmd.Flags().Bool("node", false, "serve every pod of the node: the same as --mode node (env MESHAGENT_MODE)")

	return runCmd
}

// newConfigCommand is `meshagent config`.
func newConfigCommand(env []string, stdout, stderr io.Writer) *cobra.Command {
	var output string
	configCmd := &cobra.Command{
		Use:   "config",
		Short: "Print the resolved configuration and the certificate source that would be chosen",
		Long: "Print every setting with its value and where the value came from (default, env or flag),\n" +
			"and the certificate source `meshagent run` would choose, without starting anything.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return configError(fmt.Errorf("invalid --output=%q: accepted: text, json", output))
			}
			if err := nodeFlag(cmd); err != nil {
				return err
			}
			cfg, err := resolve(cmd.Flags(), env)
			if err != nil {
				return err
			}
			// The checks run makes, by the same code: New starts nothing.
			a, err := app.New(app.Config{Settings: cfg, Version: version})
			if err != nil {
				// A misspelt name is often why: say it before the error.
				for _, wn := range cfg.Unknown() {
					fmt.Fprintf(stderr, "warning: %s\n", unknownString(wn))
				}
				if errors.As(err, new(app.ConfigError)) {
					return configError(err)
				}
				return runFailure(err)
			}
			return printConfig(stdout, cfg, a.Source(), output)
		},
	}
	addSettingFlags(configCmd.Flags())
	configCmd.Flags().Bool("node", false, "as run --node: the same as --mode node (env MESHAGENT_MODE)")
	configCmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")

	return configCmd
}

// newVersionCommand is `meshagent version`.
func newVersionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintln(stdout, versionString())
		},
	}
}

// newDocsCommand is the hidden `meshagent docs` that writes
// docs/configuration.md.
func newDocsCommand(stdout io.Writer) *cobra.Command {
	var docsOut string
	docsCmd := &cobra.Command{
		Use:    "docs",
		Short:  "Write the configuration reference (docs/configuration.md) generated from the settings registry",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			doc := append(settings.Markdown(), '\n')
			if docsOut == "" || docsOut == "-" {
				_, err := stdout.Write(doc)
				return err
			}
			tmp := docsOut + ".tmp"
			if err := os.WriteFile(tmp, doc, 0o644); err != nil {
				return runFailure(err)
			}
			if err := os.Rename(tmp, docsOut); err != nil {
				return runFailure(err)
			}
			return nil
		},
	}
	docsCmd.Flags().StringVarP(&docsOut, "output", "o", "-", "file to write, - for stdout")

	return docsCmd
}

// nodeFlag turns --node into --mode node.
func nodeFlag(cmd *cobra.Command) error {
	if node, _ := cmd.Flags().GetBool("node"); node {
		if err := cmd.Flags().Set("mode", settings.ModeNode); err != nil {
			return configError(err)
		}
	}
	return nil
}

// addSettingFlags declares a flag for every setting that has one.
func addSettingFlags(fs *pflag.FlagSet) {
	for i := range settings.Registry {
		s := &settings.Registry[i]
		if s.Flag == "" {
			continue
		}
		// pflag takes backquoted text in a usage as the value's name: the
		// docs' backquotes become plain quotes here.
		usage := strings.ReplaceAll(s.Doc, "`", "'") + " (env " + s.Name + ")"
		if s.DerivedDefault != "" && s.Default == "" {
			usage += " (default: " + s.DerivedDefault + ")"
		}
		fs.Var(&flagValue{typ: flagType(s), value: s.Default}, s.Flag, usage)
		if s.Value.Type == "bool" {
			fs.Lookup(s.Flag).NoOptDefVal = "true"
		}
	}
}

// flagValue is a setting's flag: the text given, parsed by the settings
// registry with the environment; its type names the value in --help.
type flagValue struct{ typ, value string }

func (v *flagValue) String() string     { return v.value }
func (v *flagValue) Set(s string) error { v.value = s; return nil }
func (v *flagValue) Type() string       { return v.typ }

// flagType is the value name --help shows: the registry's type, one word.
func flagType(s *settings.Setting) string {
	switch t := s.Value.Type; t {
	case "bool":
		return "bool" // pflag shows no value name for it
	case "enum":
		return "value"
	default:
		return strings.ReplaceAll(t, " ", "-")
	}
}

// noArgs is cobra.NoArgs with the usage error a user can act on.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return configError(fmt.Errorf("%s takes no arguments, got %q: settings are flags (--name=value) or environment variables; see %s --help",
		cmd.CommandPath(), args, cmd.CommandPath()))
}

// resolve reads the flags that were given and the environment into a Config.
func resolve(fs *pflag.FlagSet, env []string) (*settings.Config, error) {
	flags := map[string]string{}
	fs.Visit(func(f *pflag.Flag) {
		if settings.SettingByFlag(f.Name) != nil {
			flags[f.Name] = f.Value.String()
		}
	})
	cfg, err := settings.Resolve(settings.Input{Env: env, Flags: flags})
	if err != nil {
		return nil, configError(err)
	}
	return cfg, nil
}
