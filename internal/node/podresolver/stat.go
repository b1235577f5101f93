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

// startTime reads field 22 of the stat file of pid's main thread,
// <dir>/task/<pid>/stat: when the process started, in clock ticks since
// boot. Two processes that ever held one pid differ in it (unless both
// started within one tick, see doc.go). <dir>/stat would say the same but
// costs O(threads): the kernel sums every thread's times into it (0.8 ms
// at 8,000 threads), and a caller chooses how many threads it has. The
// file is read into buf[len(buf):], grown if it is too small; buf's
// content is left as it is.
func startTime(dir string, pid int32, buf []byte) (uint64, error) {
	data, err := appendFile(buf, filepath.Join(dir, "task", strconv.Itoa(int(pid)), "stat"), maxStatFile)
	if err != nil {
		return 0, err
	}
	return parseStartTime(data[len(buf):])
}

// maxStatFile bounds what is read of /proc/<pid>/stat (52 numbers and a
// command name of at most 64 bytes: about 1 KiB at the most).
const maxStatFile = 4096

// parseStartTime reads the start time from the content of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so fields are counted after its last ')'.
func parseStartTime(data []byte) (uint64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	// The first field after the name is field 3 (state); field 22 is the
	// 20th. Fields are split as bytes.Fields would split the kernel's
	// ASCII, without allocating the list of them.
	const want = 22 - 3 + 1
	rest := data[end+1:]
	var field []byte
	n := 0
	for n < want {
		rest = bytes.TrimLeft(rest, asciiSpace)
		if len(rest) == 0 {
			break
		}
		i := bytes.IndexAny(rest, asciiSpace)
		if i < 0 {
			i = len(rest)
		}
		field, rest = rest[:i], rest[i:]
		n++
	}
	if n < want {
		return 0, fmt.Errorf("stat: %d fields after the command name, want more than %d", n, want-1)
	}
	v, err := strconv.ParseUint(string(field), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: start time: %w", err)
	}
	return v, nil
}

// asciiSpace separates the fields of /proc/<pid>/stat.
const asciiSpace = " \t\n\v\f\r"

// appendFile appends the whole content of a file to buf, growing it only
// when it is full, and fails when the file is larger than limit. A lookup
// reads its three small /proc files into one buffer this way (what each new
// connection costs in node mode).
func appendFile(buf []byte, name string, limit int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	start := len(buf)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf)-start > limit {
			return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
