package podresolver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// startTime reads field 22 of <dir>/stat: when the process started, in clock
// ticks since boot. Two processes that ever held one pid differ in it
// (unless both started within one tick, see doc.go).
func startTime(dir string) (uint64, error) {
	data, err := readLimited(filepath.Join(dir, "stat"), 4096)
	if err != nil {
		return 0, err
	}
	return parseStartTime(data)
}

// parseStartTime reads the start time from the content of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so fields are counted after its last ')'.
func parseStartTime(data []byte) (uint64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	fields := bytes.Fields(data[end+1:])
	// fields[0] is field 3 (state); field 22 is fields[19].
	const idx = 22 - 3
	if len(fields) <= idx {
		return 0, fmt.Errorf("stat: %d fields after the command name, want more than %d", len(fields), idx)
	}
	v, err := strconv.ParseUint(string(fields[idx]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: start time: %w", err)
	}
	return v, nil
}

// readLimited reads a whole file, failing when it is larger than limit.
func readLimited(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return buf.Bytes(), nil
}
