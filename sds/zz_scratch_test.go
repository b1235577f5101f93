package sds

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
	"github.com/meshagent/meshagent/internal/uds/udsserver"
	_ "unsafe"

	"github.com/meshagent/meshagent/test/sdsclient"
)

//go:linkname allgs runtime.allgs
var allgs []unsafe.Pointer

func gstacks() map[uint64][2]uintptr {
	out := map[uint64][2]uintptr{}
	for _, g := range allgs {
		lo := *(*uintptr)(g)
		hi := *(*uintptr)(unsafe.Add(g, 8))
		sp := *(*uintptr)(unsafe.Add(g, 56))
		goid := *(*uint64)(unsafe.Add(g, 152))
		out[goid] = [2]uintptr{hi - lo, hi - sp}
	}
	return out
}

func TestScratchStacks(t *testing.T) {
	if os.Getenv("SCRATCH") == "" {
		t.Skip()
	}
	const n = 200
	f := newFixture(t, fixtureOpts{socket: func(c *udsserver.Config) { c.MaxConnsPerCaller = 1000 }})
	var all []*sdsclient.Stream
	for range n {
		c := f.dial()
		s := f.stream(c, sdsclient.StreamConfig{Names: []string{"default"}})
		all = append(all, s)
	}
	for _, s := range all {
		next(t, s)
	}
	time.Sleep(200 * time.Millisecond)
	if os.Getenv("SCRATCH_GC") != "" {
		runtime.GC()
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("StackInuse %d", ms.StackInuse)
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	st := gstacks()
	re := regexp.MustCompile(`(?s)goroutine (\d+) \[[^\]]*\]:\n(.*?)(?:\n\n|$)`)
	type key struct {
		top     string
		size, used uintptr
	}
	hist := map[key]int{}
	for _, m := range re.FindAllSubmatch(buf, -1) {
		id, _ := strconv.ParseUint(string(m[1]), 10, 64)
		lines := bytes.Split(m[2], []byte("\n"))
		creator := ""
		for i, l := range lines {
			if bytes.HasPrefix(l, []byte("created by ")) {
				creator = regexp.MustCompile(` in goroutine \d+`).ReplaceAllString(string(l), "")
			}
			_ = i
		}
		// the deepest non-runtime frame
		top := ""
		for i := 0; i < len(lines); i += 2 {
			l := string(lines[i])
			if !bytes.HasPrefix(lines[i], []byte("runtime.")) && !bytes.HasPrefix(lines[i], []byte("internal/")) {
				top = regexp.MustCompile(`\([^()]*\)$`).ReplaceAllString(l, "")
				break
			}
		}
		s := st[id]
		hist[key{fmt.Sprintf("%.60s | %.80s", top, creator), s[0], s[1]}]++
	}
	var keys []key
	for k, c := range hist {
		if c >= 3 || strings.Contains(k.top, "handleRawConn") {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].top < keys[j].top })
	for _, k := range keys {
		t.Logf("%4d size %5d used %5d %s", hist[k], k.size, k.used, k.top)
	}
}

