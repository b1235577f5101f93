package programtb

import "testing"

func TestTB(t *testing.T) {
	tb := New("prog")
	var order []int
	tb.Cleanup(func() { order = append(order, 1) })
	tb.Cleanup(func() { order = append(order, 2) })
	err := Guard(func() { tb.Fatalf("bad %d", 7) })
	if err == nil || err.Error() != "bad 7" {
		t.Errorf("Guard = %v", err)
	}
	if err := Guard(func() {}); err != nil {
		t.Errorf("Guard of a clean run = %v", err)
	}
	tb.Close()
	tb.Close()
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Errorf("cleanups ran in order %v, want [2 1] once", order)
	}
	if tb.Name() != "prog" {
		t.Errorf("Name = %q", tb.Name())
	}
	defer func() {
		if r := recover(); r != "other" {
			t.Errorf("recovered %v, want the original panic", r)
		}
	}()
	_ = Guard(func() { panic("other") })
}
