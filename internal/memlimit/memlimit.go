package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// Share is the part of the cgroup's limit given to Go as its soft limit:
// the rest is for what the runtime does not count (binary pages, stacks
// beyond the heap's goal, the kernel's socket buffers).
const Share = 0.9

// unlimited: cgroup v1 writes "no limit" as a page-rounded maximum
// (9223372036854771712); anything from here up means none.
const unlimited = int64(1) << 62

// ErrNoLimit: the cgroup has no memory limit (or there is no memory
// controller to ask).
var ErrNoLimit = errors.New("no cgroup memory limit")

// Limit returns the memory limit in bytes of the cgroup the process is in,
// read under root, and the file it came from. A cgroup without a limit (and
// no ancestor with one) is ErrNoLimit.
func Limit(root string) (int64, string, error) {
	cg, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, "", fmt.Errorf("reading the process's cgroups: %w", err)
	}
	f, err := os.Open(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return 0, "", fmt.Errorf("reading the mount table: %w", err)
	}
	mounts, err := mountinfo.GetMountsFromReader(f, nil)
	f.Close()
	if err != nil {
		return 0, "", err
	}
	v1, v2, err := parseCgroup(cg)
	if err != nil {
		return 0, "", err
	}
	if v2 != "" {
		// A hybrid host mounts cgroup2 beside v1 hierarchies; it holds the
		// memory controller only when its root lists it.
		if m, ok := find(mounts, func(e *mountinfo.Info) bool { return e.FSType == "cgroup2" }); ok && v2HasMemory(root, m) {
			return walk(root, m, v2, "memory.max")
		}
	}
	if v1 != "" {
		if m, ok := find(mounts, func(e *mountinfo.Info) bool {
			return e.FSType == "cgroup" && contains(strings.Split(e.VFSOptions, ","), "memory")
		}); ok {
			return walk(root, m, v1, "memory.limit_in_bytes")
		}
	}
	return 0, "", ErrNoLimit
}

// parseCgroup returns the process's cgroup path in the v1 memory hierarchy
// and in the v2 unified one ("" when absent), from /proc/self/cgroup
// (cgroups(7): "hierarchy-ID:controller-list:path" per line).
func parseCgroup(b []byte) (v1, v2 string, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		controllers, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !strings.HasPrefix(p, "/") {
			return "", "", fmt.Errorf("/proc/self/cgroup line %q: want hierarchy-ID:controllers:/path", line)
		}
		switch {
		case id == "0" && controllers == "":
			v2 = p
		case contains(strings.Split(controllers, ","), "memory"):
			v1 = p
		}
	}
	return v1, v2, sc.Err()
}

// v2HasMemory reports whether the cgroup2 hierarchy mounted at m has the
// memory controller (its cgroup.controllers lists it).
func v2HasMemory(root string, m *mountinfo.Info) bool {
	b, err := os.ReadFile(filepath.Join(root, m.Mountpoint, "cgroup.controllers"))
	return err == nil && contains(strings.Fields(string(b)), "memory")
}

func find(mounts []*mountinfo.Info, match func(*mountinfo.Info) bool) (*mountinfo.Info, bool) {
	for _, m := range mounts {
		if match(m) {
			return m, true
		}
	}
	return nil, false
}

// walk reads file in the cgroup directory of cgPath under mount m and in
// every ancestor up to the mount, and returns the smallest limit.
func walk(root string, m *mountinfo.Info, cgPath, file string) (int64, string, error) {
	rel := cgPath
	if m.Root != "/" {
		var ok bool
		if rel, ok = strings.CutPrefix(cgPath, m.Root); !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
			// A cgroup outside what is mounted here (another namespace's
			// view): only the mount's own directory can be read.
			rel = "/"
		}
	}
	rel = path.Clean("/" + rel)
	best, from := int64(-1), ""
	for {
		p := filepath.Join(root, m.Mountpoint, rel, file)
		v, err := readLimit(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// The root cgroup has no limit file.
		case err != nil:
			return 0, "", err
		case v >= 0 && (best < 0 || v < best):
			best, from = v, filepath.Join(m.Mountpoint, rel, file)
		}
		if rel == "/" {
			break
		}
		rel = path.Dir(rel)
	}
	if best < 0 {
		return 0, "", ErrNoLimit
	}
	return best, from, nil
}

// readLimit reads a limit file: a number of bytes, or -1 for none ("max",
// or v1's huge "no limit").
func readLimit(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s: %q is not a memory limit", p, s)
	}
	if v >= unlimited {
		return -1, nil
	}
	return v, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Decision is what Apply did.
type Decision struct {
	// Limit is the cgroup's limit; 0 when none was found.
	Limit int64
	// From is the file the limit was read from.
	From string
	// Set is the soft limit given to Go; 0 when none was set.
	Set int64
	// Why says why none was set (GOMEMLIMIT is set, no limit, an error).
	Why string
}

// Apply sets Go's soft memory limit to Share of the cgroup's limit (read
// under root) unless gomemlimit (the GOMEMLIMIT variable) is set, and
// reports what it did.
func Apply(root, gomemlimit string) Decision {
	if gomemlimit != "" {
		return Decision{Why: "GOMEMLIMIT=" + gomemlimit + " is set: the Go runtime uses it"}
	}
	limit, from, err := Limit(root)
	if err != nil {
		return Decision{Why: err.Error()}
	}
	set := int64(float64(limit) * Share)
	debug.SetMemoryLimit(set)
	return Decision{Limit: limit, From: from, Set: set}
}
