package logging

import (
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

// Levels lists the accepted level names.
var Levels = []string{"debug", "info", "warn", "error"}

// ParseLevel accepts one of Levels.
func ParseLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info", "":
		return zapcore.InfoLevel, nil
	case "warn":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return zapcore.InfoLevel, fmt.Errorf("unknown log level %q (accepted: %s)", s, strings.Join(Levels, ", "))
}

// Config describes a logger.
type Config struct {
	// Level is one of Levels. Default info.
	Level string
	// Output receives the log lines. Default os.Stderr.
	Output io.Writer
	// Console forces the console encoder (true) or JSON (false). Nil means
	// console exactly when Output is a terminal.
	Console *bool
}

// New builds a logger from cfg.
func New(cfg Config) (*zap.Logger, error) {
	level, err := ParseLevel(cfg.Level)
	if err != nil {
		return nil, err
	}
	if cfg.Output == nil {
		cfg.Output = os.Stderr
	}
	console := IsTerminal(cfg.Output)
	if cfg.Console != nil {
		console = *cfg.Console
	}
	out := zapcore.Lock(zapcore.AddSync(cfg.Output))
	return zap.New(zapcore.NewCore(Encoder(console), out, level), zap.ErrorOutput(out)), nil
}

// ConsoleTimeLayout is how the console encoder writes times: the line's
// and every time field's, date included.
const ConsoleTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// Encoder returns the console encoder (coloured levels, readable times) or
// the JSON encoder (RFC 3339 times, for log collectors).
func Encoder(console bool) zapcore.Encoder {
	if console {
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		// With the date: a certificate's not_after tomorrow must not read
		// as a time that has passed today.
		ec.EncodeTime = zapcore.TimeEncoderOfLayout(ConsoleTimeLayout)
		ec.StacktraceKey = ""
		return zapcore.NewConsoleEncoder(ec)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "time"
	ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	ec.StacktraceKey = ""
	return zapcore.NewJSONEncoder(ec)
}

// IsTerminal reports whether w is a terminal (a file whose descriptor is one).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}
