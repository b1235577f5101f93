package mountinfo

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n" +
		"37 36 0:5 / /with\\040space ro,nosuid shared:2 - tmpfs tmpfs rw\n" +
		"38 36 0:6 / /plain rw - proc proc rw\n"
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3", len(got))
	}
	if got[0].ID != 36 || got[0].ParentID != 35 || got[0].Root != "/mnt1" || got[0].Point != "/mnt2" || got[0].ReadOnly() {
		t.Fatalf("first entry %+v", got[0])
	}
	if got[1].Point != "/with space" || !got[1].ReadOnly() {
		t.Fatalf("second entry %+v", got[1])
	}
	if got[2].Point != "/plain" {
		t.Fatalf("third entry %+v", got[2])
	}
	for _, bad := range []string{"1 2 3", "x 1 0:1 / /a rw - t s rw", "1 2 0:1 / /a rw shared:1 t s rw x", "1 2 0:1 / /a\\04 rw - t s rw"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestAtReadsTheRealTable(t *testing.T) {
	m, err := At("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) == 0 {
		t.Fatal("no mount at /proc in /proc/self/mountinfo")
	}
}

func FuzzParse(f *testing.F) {
	f.Add("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n")
	f.Add("37 36 0:5 / /with\\040space ro,nosuid shared:2 - tmpfs tmpfs rw\n")
	f.Add("1 2 0:1 / /a\\ rw - t s rw")
	f.Fuzz(func(t *testing.T, s string) {
		entries, err := Parse(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.Options == nil {
				t.Fatalf("entry without options: %+v", e)
			}
		}
	})
}
