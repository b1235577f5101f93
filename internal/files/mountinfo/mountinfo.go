// Package mountinfo reads the kernel's mount table (/proc/self/mountinfo,
// proc(5)): the CSI driver finds what it has published there, and the
// OUTPUT_CERTS writer tells a volume from a plain directory.
package mountinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Entry is one line of /proc/<pid>/mountinfo (proc(5)): the fields the driver reads.
type Entry struct {
	ID       int
	ParentID int
	Root     string // the directory of the source file system mounted here
	Point    string // the mount point, relative to the reader's root
	Options  []string
	// FSType is the file system type ("cgroup2", "cgroup", "tmpfs").
	FSType string
	// SuperOptions are the super block's options (a cgroup v1 mount's
	// controllers: "rw,memory").
	SuperOptions []string
}

// ReadOnly reports whether the mount itself (not its super block) is read-only.
func (e Entry) ReadOnly() bool {
	for _, o := range e.Options {
		if o == "ro" {
			return true
		}
	}
	return false
}

// Parse parses the content of a mountinfo file. Paths are unescaped (the
// kernel writes space, tab, newline and backslash as \ooo octal).
func Parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		e, err := parseLine(line)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}

func parseLine(line string) (Entry, error) {
	// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
	f := strings.Fields(line)
	if len(f) < 10 {
		return Entry{}, fmt.Errorf("mountinfo line %q: %d fields, want at least 10", line, len(f))
	}
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+3 {
		return Entry{}, fmt.Errorf("mountinfo line %q: no file system fields", line)
	}
	id, err := strconv.Atoi(f[0])
	if err != nil {
		return Entry{}, fmt.Errorf("mountinfo line %q: mount id: %w", line, err)
	}
	parent, err := strconv.Atoi(f[1])
	if err != nil {
		return Entry{}, fmt.Errorf("mountinfo line %q: parent id: %w", line, err)
	}
	root, err := unescapeMountPath(f[3])
	if err != nil {
		return Entry{}, fmt.Errorf("mountinfo line %q: root: %w", line, err)
	}
	point, err := unescapeMountPath(f[4])
	if err != nil {
		return Entry{}, fmt.Errorf("mountinfo line %q: mount point: %w", line, err)
	}
	return Entry{ID: id, ParentID: parent, Root: root, Point: point, Options: strings.Split(f[5], ","),
		FSType: f[sep+1], SuperOptions: strings.Split(f[sep+3], ",")}, nil
}

// unescapeMountPath undoes the kernel's \ooo escaping of a mountinfo path.
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("truncated escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

// At returns the mounts whose mount point is path, in the order the kernel lists
// them (the last one is on top), read from the calling process's mount table.
func At(path string) ([]Entry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := Parse(f)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range all {
		if e.Point == path {
			out = append(out, e)
		}
	}
	return out, nil
}
